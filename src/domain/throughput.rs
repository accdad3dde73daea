//! Rows per second over the last few seconds, for a seed or a replay in progress: an
//! operator deciding whether to wait wants the pace now, not the average since it began.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How far back the pace looks.
const WINDOW: Duration = Duration::from_secs(10);
/// Samples closer together than this are folded into one.
const SAMPLE_EVERY: Duration = Duration::from_millis(500);

#[derive(Debug, Default)]
pub struct Throughput {
    /// (when, rows done then), oldest first, spanning at most [`WINDOW`].
    samples: VecDeque<(Instant, u64)>,
}

impl Throughput {
    /// Records that `done` rows were done at `at`, and answers the rows per second over the
    /// window; 0 until two samples are apart, and after `done` went backwards (a new run).
    pub fn record(&mut self, at: Instant, done: u64) -> f64 {
        if self.samples.back().is_some_and(|&(_, last)| done < last) {
            self.samples.clear();
        }
        let due = self.samples.back().is_none_or(|&(t, _)| at.duration_since(t) >= SAMPLE_EVERY);
        if due {
            self.samples.push_back((at, done));
        }
        while self.samples.len() > 2
            && self.samples.front().is_some_and(|&(t, _)| at.duration_since(t) > WINDOW)
        {
            self.samples.pop_front();
        }
        match self.samples.front() {
            Some(&(first, rows)) if at > first => {
                (done - rows) as f64 / at.duration_since(first).as_secs_f64()
            }
            _ => 0.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pace_is_that_of_the_last_seconds() {
        let start = Instant::now();
        let mut pace = Throughput::default();
        assert_eq!(pace.record(start, 0), 0.0);
        // 100 rows/s for 20 s, then 1,000 rows/s for 20 s.
        let mut done = 0;
        for tenth in 1..=400u64 {
            done += if tenth <= 200 { 10 } else { 100 };
            let rate = pace.record(start + Duration::from_millis(tenth * 100), done);
            if tenth == 200 {
                assert!((rate - 100.0).abs() < 1.0, "{rate}");
            }
            if tenth == 400 {
                assert!((rate - 1_000.0).abs() < 20.0, "{rate}");
            }
        }
    }

    #[test]
    fn a_count_that_went_back_starts_over() {
        let start = Instant::now();
        let mut pace = Throughput::default();
        pace.record(start, 500);
        assert!(pace.record(start + Duration::from_secs(1), 600) > 0.0);
        assert_eq!(pace.record(start + Duration::from_secs(2), 10), 0.0);
        let rate = pace.record(start + Duration::from_secs(3), 60);
        assert!((rate - 50.0).abs() < 1.0, "{rate}");
    }
}
