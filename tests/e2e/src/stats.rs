//! The benchmarks' figures: quantiles, and how far a ratio of two sides' quantiles can be
//! trusted.
//!
//! The reaction benchmark's samples are not independent: a burst's ten drains share its
//! moment (the node's load, the API server's state), so 400 burst samples are closer to 40
//! than to 400 observations. [`ratio_interval`] resamples whole rounds, not samples, so its
//! interval says how much a ratio moves from one run of the same rounds to the next.

use std::collections::BTreeMap;
use std::time::Duration;

/// Resamples drawn by [`ratio_interval`].
pub const DRAWS: usize = 2000;

/// One round's samples: the first side's and the second's.
type Round = (Vec<Duration>, Vec<Duration>);

/// A small linear congruential generator: the same numbers every run (the reaction
/// benchmark's shuffled schedule, [`ratio_interval`]'s draws; `tests/bench/trace-figures` has
/// its twin).
pub struct Lcg(u64);

impl Lcg {
    /// Starts from the seed both users share.
    pub fn new() -> Self {
        Self(0x5eed_2027)
    }

    /// The next index below `n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as usize % n
    }
}

impl Default for Lcg {
    fn default() -> Self {
        Self::new()
    }
}

/// The `q` quantile (0..=1) of `samples`, in milliseconds (0 without samples): the sample at
/// rank `round((n - 1) q)`, no interpolation.
pub fn quantile(samples: &[Duration], q: f64) -> f64 {
    let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    ms.sort_by(f64::total_cmp);
    if ms.is_empty() {
        return 0.0;
    }
    ms[((ms.len() as f64 - 1.0) * q).round() as usize]
}

/// The ratio of the `q` quantiles of `a` and `b` (samples tagged with their round), and a 90%
/// interval for it: a paired cluster bootstrap. Each of [`DRAWS`] draws takes as many rounds
/// as there are, with replacement, among the rounds both sides have samples of, and both
/// sides' samples of each round drawn; the interval is the 5th and 95th percentiles of the
/// draws' ratios. Deterministic (a fixed linear congruential generator, the one
/// `tests/bench/trace-figures` uses too), so the same samples give the same interval. `None`
/// without a round both sides have.
pub fn ratio_interval(
    a: &[(usize, Duration)],
    b: &[(usize, Duration)],
    q: f64,
) -> Option<(f64, f64, f64)> {
    let mut rounds: BTreeMap<usize, Round> = BTreeMap::new();
    for (r, d) in a {
        rounds.entry(*r).or_default().0.push(*d);
    }
    for (r, d) in b {
        rounds.entry(*r).or_default().1.push(*d);
    }
    let both: Vec<&Round> = rounds
        .values()
        .filter(|(x, y)| !x.is_empty() && !y.is_empty())
        .collect();
    if both.is_empty() {
        return None;
    }
    let first: Vec<Duration> = both.iter().flat_map(|r| r.0.iter().copied()).collect();
    let second: Vec<Duration> = both.iter().flat_map(|r| r.1.iter().copied()).collect();
    let point = quantile(&first, q) / quantile(&second, q);
    let mut draw = Lcg::new();
    let mut ratios = Vec::with_capacity(DRAWS);
    for _ in 0..DRAWS {
        let (mut x, mut y) = (Vec::new(), Vec::new());
        for _ in 0..both.len() {
            let (xs, ys) = both[draw.below(both.len())];
            x.extend_from_slice(xs);
            y.extend_from_slice(ys);
        }
        ratios.push(quantile(&x, q) / quantile(&y, q));
    }
    ratios.sort_by(f64::total_cmp);
    let at = |p: f64| ratios[((DRAWS as f64 - 1.0) * p).round() as usize];
    Some((point, at(0.05), at(0.95)))
}

#[cfg(test)]
mod tests {
    use super::*;

    type Tagged = Vec<(usize, Duration)>;

    fn ms(x: f64) -> Duration {
        Duration::from_secs_f64(x / 1000.0)
    }

    /// `rounds` rounds of `per` samples each, spread over a base that differs by round.
    fn rounds(rounds: usize, per: usize, scale: f64) -> Tagged {
        (0..rounds)
            .flat_map(|r| {
                let base = 10.0 + (r * 7 % 40) as f64;
                (0..per).map(move |i| (r, ms((base + i as f64) * scale)))
            })
            .collect()
    }

    #[test]
    fn quantile_takes_the_sample_at_the_rounded_rank() {
        let xs: Vec<Duration> = [5.0, 1.0, 3.0, 2.0, 4.0].map(ms).to_vec();
        assert!((quantile(&xs, 0.5) - 3.0).abs() < 1e-9);
        assert!((quantile(&xs, 1.0) - 5.0).abs() < 1e-9);
        assert!((quantile(&xs, 0.0) - 1.0).abs() < 1e-9);
        assert!(
            (quantile(&xs, 0.9) - 5.0).abs() < 1e-9,
            "rank round(3.6) = 4"
        );
        assert_eq!(quantile(&[], 0.5), 0.0);
    }

    #[test]
    fn a_side_slower_by_one_factor_in_every_round_has_that_ratio_and_no_spread() {
        let floor = rounds(40, 10, 1.0);
        let side = rounds(40, 10, 1.25);
        for q in [0.5, 0.99] {
            let (point, lo, hi) = ratio_interval(&side, &floor, q).unwrap();
            assert!((point - 1.25).abs() < 1e-9, "{point}");
            assert!(
                (lo - 1.25).abs() < 1e-9 && (hi - 1.25).abs() < 1e-9,
                "{lo}..{hi}"
            );
        }
    }

    #[test]
    fn rounds_that_differ_between_the_sides_give_an_interval_around_the_ratio() {
        let floor = rounds(40, 10, 1.0);
        // Slower in a third of the rounds, faster in another third.
        let side: Tagged = floor
            .iter()
            .map(|(r, d)| {
                let f = [1.0, 1.6, 0.7][r % 3];
                (*r, d.mul_f64(f))
            })
            .collect();
        let (point, lo, hi) = ratio_interval(&side, &floor, 0.5).unwrap();
        assert!(lo < point && point < hi, "{lo} < {point} < {hi}");
        assert!(hi - lo > 0.05, "the rounds' spread shows: {lo}..{hi}");
        // The same samples, the same interval.
        assert_eq!(ratio_interval(&side, &floor, 0.5), Some((point, lo, hi)));
    }

    #[test]
    fn fewer_rounds_of_the_same_kind_give_a_wider_interval() {
        let mixed = |n: usize| -> (Tagged, Tagged) {
            let floor = rounds(n, 10, 1.0);
            let side = floor
                .iter()
                .map(|(r, d)| (*r, d.mul_f64([1.0, 1.6, 0.7][r % 3])))
                .collect();
            (side, floor)
        };
        let width = |n| {
            let (a, b) = mixed(n);
            let (_, lo, hi) = ratio_interval(&a, &b, 0.5).unwrap();
            hi - lo
        };
        assert!(width(12) > width(120), "{} vs {}", width(12), width(120));
    }

    #[test]
    fn only_rounds_both_sides_have_count_and_none_without_any() {
        let a = vec![(0, ms(10.0)), (1, ms(20.0)), (2, ms(1000.0))];
        let b = vec![(0, ms(10.0)), (1, ms(20.0))];
        let (point, lo, hi) = ratio_interval(&a, &b, 1.0).unwrap();
        assert!((point - 1.0).abs() < 1e-9 && (lo - 1.0).abs() < 1e-9 && (hi - 1.0).abs() < 1e-9);
        assert_eq!(ratio_interval(&a[2..], &b, 0.5), None);
    }
}
