//! Spacing out work: [`RateLimiter`] caps how many units (`PUT`s, or bytes sent) go per second
//! across every transfer sharing it.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Caps how many units (requests, bytes) go per second, across every task sharing it.
///
/// Each caller reserves the next free span for its units, starting where the previous span
/// ended or now, whichever is later, and sleeps until its start: spans never overlap, the first
/// starts at once, and time spent idle does not accumulate into a burst.
#[derive(Debug)]
pub struct RateLimiter {
    per_second: u64,
    next: Mutex<Instant>,
}

impl RateLimiter {
    /// A limiter for `per_second` units a second, or `None` for `0` (no limit).
    pub fn new(per_second: u64) -> Option<Self> {
        (per_second > 0).then(|| Self {
            per_second,
            next: Mutex::new(Instant::now()),
        })
    }

    /// How long `units` take at this rate, rounded up so the rate is never exceeded.
    pub fn span(&self, units: u64) -> Duration {
        let nanos = (u128::from(units) * 1_000_000_000).div_ceil(u128::from(self.per_second));
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// Reserves the next span for `units` and answers when it starts (now, or later).
    pub fn reserve(&self, units: u64) -> Instant {
        let now = Instant::now();
        let mut next = self.next.lock().expect("lock poisoned");
        let start = (*next).max(now);
        *next = start + self.span(units);
        start
    }

    /// Waits for one unit's turn (one request).
    pub async fn wait_turn(&self) {
        let turn = self.reserve(1);
        if turn > Instant::now() {
            tokio::time::sleep_until(turn).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn rate_limiter_lets_the_first_through_at_once_and_never_bursts() {
        use futures::FutureExt;

        assert!(RateLimiter::new(0).is_none(), "0 is no limit");
        assert_eq!(
            RateLimiter::new(3).unwrap().span(1),
            Duration::from_nanos(333_333_334),
            "rounded up"
        );
        assert_eq!(
            RateLimiter::new(u64::from(u32::MAX)).unwrap().span(1),
            Duration::from_nanos(1)
        );

        // One a second: the first is immediate, the second must wait.
        let limiter = RateLimiter::new(1).unwrap();
        assert!(limiter.wait_turn().now_or_never().is_some());
        assert!(limiter.wait_turn().now_or_never().is_none());

        // Idle time does not build up a burst: after a pause, one goes through, not several.
        let limiter = RateLimiter::new(10).unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(limiter.wait_turn().now_or_never().is_some());
        assert!(limiter.wait_turn().now_or_never().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn bytes_are_spaced_by_their_count() {
        // 1,000 bytes a second: 500 bytes now, the next 500 half a second later, then 2,000
        // bytes one second after that, and the next span two seconds after those.
        let limiter = RateLimiter::new(1_000).unwrap();
        let t0 = Instant::now();
        assert_eq!(limiter.reserve(500), t0);
        assert_eq!(limiter.reserve(500), t0 + Duration::from_millis(500));
        assert_eq!(limiter.reserve(2_000), t0 + Duration::from_secs(1));
        assert_eq!(limiter.reserve(1), t0 + Duration::from_secs(3));
        assert_eq!(
            RateLimiter::new(3).unwrap().span(u64::MAX),
            Duration::from_nanos(u64::MAX),
            "saturates"
        );
    }
}
