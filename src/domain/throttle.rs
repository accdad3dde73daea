//! A log line that anyone may cause (a login emitting non-transactional messages) written at
//! most once per interval, saying how many were left out since: the count stays exact in
//! `/metrics`, and the log cannot be flooded.

use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct Throttle {
    every: Duration,
    last: Option<Instant>,
    left_out: u64,
}

impl Throttle {
    pub fn new(every: Duration) -> Throttle {
        Throttle { every, last: None, left_out: 0 }
    }

    /// `Some(n)` when the line may be written at `now`, `n` lines having been left out
    /// since the last one; `None` when it is left out.
    pub fn allow(&mut self, now: Instant) -> Option<u64> {
        if self.last.is_some_and(|last| now.saturating_duration_since(last) < self.every) {
            self.left_out += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.left_out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_with_the_count_left_out() {
        let t0 = Instant::now();
        let mut throttle = Throttle::new(Duration::from_secs(60));
        assert_eq!(throttle.allow(t0), Some(0));
        for s in 1..=10 {
            assert_eq!(throttle.allow(t0 + Duration::from_secs(s)), None);
        }
        assert_eq!(throttle.allow(t0 + Duration::from_secs(60)), Some(10));
        assert_eq!(throttle.allow(t0 + Duration::from_secs(61)), None);
    }
}
