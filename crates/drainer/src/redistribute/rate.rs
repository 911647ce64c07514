//! Spacing out `PUT`s: [`RateLimiter`] caps how many start per second across every transfer.

use std::sync::Mutex;
use std::time::Duration;

/// Caps how many `PUT`s start per second, across every task sharing it.
///
/// Each caller reserves the next free slot, `period` after the previous slot or now, whichever
/// is later, and sleeps until it: slots are at least `period` apart, the first is immediate,
/// and time spent idle does not accumulate into a burst.
#[derive(Debug)]
pub struct RateLimiter {
    period: Duration,
    next: Mutex<tokio::time::Instant>,
}

impl RateLimiter {
    /// A limiter for `per_second` starts a second, or `None` for `0` (no limit).
    pub fn new(per_second: u32) -> Option<Self> {
        if per_second == 0 {
            return None;
        }
        // Rounded up, so the rate never exceeds `per_second`.
        let nanos = 1_000_000_000u64.div_ceil(u64::from(per_second));
        Some(Self {
            period: Duration::from_nanos(nanos),
            next: Mutex::new(tokio::time::Instant::now()),
        })
    }

    /// Waits for this caller's turn.
    pub async fn wait_turn(&self) {
        let now = tokio::time::Instant::now();
        let slot = {
            let mut next = self.next.lock().expect("lock poisoned");
            let slot = (*next).max(now);
            *next = slot + self.period;
            slot
        };
        if slot > now {
            tokio::time::sleep_until(slot).await;
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
            RateLimiter::new(3).unwrap().period,
            Duration::from_nanos(333_333_334),
            "rounded up"
        );
        assert_eq!(
            RateLimiter::new(u32::MAX).unwrap().period,
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
}
