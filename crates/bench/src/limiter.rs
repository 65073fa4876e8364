//! A shared rate limiter with the semantics of Go's `rate.NewLimiter(r, burst)`
//! as etcd's benchmark uses it: `burst` requests may go at once, then one
//! every `1/r` seconds. Implemented as GCRA: one timestamp under a mutex held
//! only for arithmetic, never across an await.

use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct RateLimiter {
    interval: Duration,
    /// How far ahead of the theoretical arrival time a request may go (burst - 1 intervals).
    tolerance: Duration,
    theoretical_arrival: Mutex<Instant>,
}

impl RateLimiter {
    /// `None` for a rate of 0, which etcd's benchmark treats as unlimited.
    pub fn new(per_second: u64, burst: u64) -> Option<RateLimiter> {
        if per_second == 0 {
            return None;
        }
        let interval = Duration::from_secs_f64(1.0 / per_second as f64);
        Some(RateLimiter {
            interval,
            tolerance: interval * (burst.max(1) - 1).min(u32::MAX as u64) as u32,
            theoretical_arrival: Mutex::new(Instant::now()),
        })
    }

    /// The instant at which the next request may go, reserving its slot.
    pub fn reserve(&self, now: Instant) -> Instant {
        let mut tat = match self.theoretical_arrival.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        let arrival = (*tat).max(now);
        *tat = arrival + self.interval;
        arrival.checked_sub(self.tolerance).unwrap_or(now).max(now)
    }

    pub async fn wait(&self) {
        let at = self.reserve(Instant::now());
        if at > Instant::now() {
            tokio::time::sleep_until(at.into()).await;
        }
    }
}

/// Wait on an optional limiter (`None` = unlimited).
pub async fn wait(limiter: Option<&RateLimiter>) {
    if let Some(limiter) = limiter {
        limiter.wait().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_rate_is_unlimited() {
        assert!(RateLimiter::new(0, 1).is_none());
    }

    #[test]
    fn burst_goes_at_once_then_one_per_interval() {
        let limiter = RateLimiter::new(100, 3).unwrap_or_else(|| unreachable!());
        let now = Instant::now();
        let slots: Vec<Duration> = (0..5)
            .map(|_| limiter.reserve(now).saturating_duration_since(now))
            .collect();
        assert_eq!(slots[0], Duration::ZERO);
        assert_eq!(slots[2], Duration::ZERO);
        let ms = |d: Duration| (d.as_secs_f64() * 1000.0).round() as u64;
        assert_eq!(ms(slots[3]), 10);
        assert_eq!(ms(slots[4]), 20);
    }
}
