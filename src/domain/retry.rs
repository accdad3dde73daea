//! How long to wait before the next attempt.

use std::time::Duration;

/// Capped exponential backoff: 200 ms doubling up to 30 s.
pub struct Backoff {
    next: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(200);
    const CAP: Duration = Duration::from_secs(30);

    pub fn new() -> Self {
        Backoff { next: Self::FIRST }
    }

    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(Self::CAP);
        delay
    }

    pub fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_cap_and_resets() {
        let mut b = Backoff::new();
        let delays: Vec<_> = (0..10).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(delays, [200, 400, 800, 1600, 3200, 6400, 12800, 25600, 30000, 30000]);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(200));
    }
}
