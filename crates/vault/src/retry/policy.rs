//! How long to wait between attempts.

use std::time::Duration;

/// Retry policy for transient failures (see [`crate::VaultError::is_retryable`]).
///
/// The wait after the n-th failed attempt (1-based) is `base_delay * 2^(n-1)`, capped at
/// `max_delay`; with `jitter`, a uniformly random value between half of that and all of
/// it ("equal jitter": concurrent mounts spread out, yet every wait keeps a floor). A
/// `Retry-After` from OCI raises the wait to at least that many seconds. No sleep ever
/// ends after the request's deadline: when the next one would, the client stops.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in total, the first included (at least 1 is always made).
    pub max_attempts: u32,
    /// The wait after the first failed attempt.
    pub base_delay: Duration,
    /// The longest computed wait (a `Retry-After` may ask for more).
    pub max_delay: Duration,
    /// Whether to randomise waits.
    pub jitter: bool,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 5,
            base_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(5),
            jitter: true,
        }
    }
}

impl RetryPolicy {
    /// A policy that never retries.
    pub fn none() -> Self {
        Self {
            max_attempts: 1,
            ..Self::default()
        }
    }

    /// The wait after `failed_attempts` failed attempts (1-based), before jitter and
    /// `Retry-After`.
    pub fn backoff(&self, failed_attempts: u32) -> Duration {
        let exponent = failed_attempts.saturating_sub(1).min(31);
        self.base_delay
            .checked_mul(1u32 << exponent)
            .unwrap_or(self.max_delay)
            .min(self.max_delay)
    }

    /// The wait after `failed_attempts` failed attempts: backoff, jitter (drawing from
    /// `random`, a uniform value in [0, 1)), then at least `retry_after`.
    pub(crate) fn delay(
        &self,
        failed_attempts: u32,
        retry_after: Option<Duration>,
        random: f64,
    ) -> Duration {
        let backoff = self.backoff(failed_attempts);
        let backoff = if self.jitter {
            let half = backoff / 2;
            half + (backoff - half).mul_f64(random.clamp(0.0, 1.0))
        } else {
            backoff
        };
        match retry_after {
            Some(wait) => backoff.max(wait),
            None => backoff,
        }
    }
}

/// A uniform random value in [0, 1) from the system RNG; 1.0 (no shortening) if the RNG
/// fails, which only lengthens a wait.
pub(crate) fn unit_random() -> f64 {
    let mut bytes = [0u8; 8];
    if aws_lc_rs::rand::fill(&mut bytes).is_err() {
        return 1.0;
    }
    // The top 53 bits fill an f64 mantissa exactly.
    (u64::from_le_bytes(bytes) >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let policy = RetryPolicy::default();
        let waits: Vec<_> = (1..=7).map(|n| policy.backoff(n).as_millis()).collect();
        assert_eq!(waits, [200, 400, 800, 1600, 3200, 5000, 5000]);
        assert_eq!(policy.backoff(u32::MAX), Duration::from_secs(5));
    }

    #[test]
    fn jitter_stays_between_half_and_all_of_the_backoff() {
        let policy = RetryPolicy::default();
        assert_eq!(policy.delay(2, None, 0.0), Duration::from_millis(200));
        assert_eq!(policy.delay(2, None, 0.5), Duration::from_millis(300));
        assert!(policy.delay(2, None, 0.999_999) <= Duration::from_millis(400));
        for _ in 0..1000 {
            let wait = policy.delay(3, None, unit_random());
            assert!((400..=800).contains(&wait.as_millis()), "{wait:?}");
        }
        let fixed = RetryPolicy {
            jitter: false,
            ..RetryPolicy::default()
        };
        assert_eq!(fixed.delay(3, None, 0.0), Duration::from_millis(800));
    }

    #[test]
    fn retry_after_raises_the_wait_but_never_lowers_it() {
        let policy = RetryPolicy::default();
        let one = Some(Duration::from_secs(1));
        assert_eq!(policy.delay(1, one, 0.3), Duration::from_secs(1));
        assert_eq!(
            policy.delay(5, Some(Duration::ZERO), 1.0),
            Duration::from_millis(3200)
        );
        // Retry-After is the server's instruction; max_delay caps only our own backoff.
        assert_eq!(
            policy.delay(1, Some(Duration::from_secs(9)), 0.0),
            Duration::from_secs(9)
        );
    }
}
