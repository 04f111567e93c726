//! What happened to each request: counts and latency histograms, per connection while the run
//! lasts (no contention), merged at the end; per-second figures for the timeline, merged each
//! second; and two shared counters for the live progress bar.
//!
//! Latency is recorded for every request that got a reply (an error reply included), from its
//! ticket's start (see `Ticket::start`); a request that got no reply (timeout, broken connection) counts only as
//! an error.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// The longest latency the histograms hold (`--timeout` is bounded by it); longer saturates.
pub(crate) const MAX_LATENCY: Duration = Duration::from_secs(60);

/// A reply that is not an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    Allowed,
    Denied,
    /// A reply that is not a rate-limit decision (`INCR`'s integer, a plain 200).
    Other,
}

/// A request that did not get a valid reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Failure {
    /// An error reply: `-ERR …`, an HTTP status other than 2xx/429, a gRPC error status.
    Reply(String),
    /// No reply: the connection failed or could not be made.
    Transport(String),
    /// No reply within `--timeout`.
    Timeout,
}

/// Counts and latencies of a set of requests.
#[derive(Debug, Clone)]
pub(crate) struct Tally {
    pub(crate) requests: u64,
    pub(crate) allowed: u64,
    pub(crate) denied: u64,
    pub(crate) error_replies: u64,
    pub(crate) transport_errors: u64,
    pub(crate) timeouts: u64,
    /// Microseconds from due to reply.
    pub(crate) latency_us: Histogram<u64>,
}

impl Tally {
    fn new(significant_figures: u8) -> Tally {
        let max = u64::try_from(MAX_LATENCY.as_micros()).unwrap_or(u64::MAX);
        Tally {
            requests: 0,
            allowed: 0,
            denied: 0,
            error_replies: 0,
            transport_errors: 0,
            timeouts: 0,
            // Bounds and figures are constants known valid, so creation cannot fail.
            latency_us: Histogram::new_with_bounds(1, max, significant_figures).unwrap_or_else(|_| unreachable!()),
        }
    }

    /// The whole run's tally: 3 significant figures (0.1%).
    pub(crate) fn total() -> Tally {
        Tally::new(3)
    }

    /// One second's tally: 2 significant figures (1%), small enough for an hour of seconds.
    fn second() -> Tally {
        Tally::new(2)
    }

    pub(crate) fn errors(&self) -> u64 {
        self.error_replies + self.transport_errors + self.timeouts
    }

    fn record(&mut self, latency: Option<Duration>, outcome: &Result<Answer, Failure>) {
        self.requests += 1;
        match outcome {
            Ok(Answer::Allowed) => self.allowed += 1,
            Ok(Answer::Denied) => self.denied += 1,
            Ok(Answer::Other) => {}
            Err(Failure::Reply(_)) => self.error_replies += 1,
            Err(Failure::Transport(_)) => self.transport_errors += 1,
            Err(Failure::Timeout) => self.timeouts += 1,
        }
        if let Some(latency) = latency {
            let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
            self.latency_us.saturating_record(us);
        }
    }

    pub(crate) fn merge(&mut self, other: &Tally) {
        self.requests += other.requests;
        self.allowed += other.allowed;
        self.denied += other.denied;
        self.error_replies += other.error_replies;
        self.transport_errors += other.transport_errors;
        self.timeouts += other.timeouts;
        // Same bounds on both sides, so adding cannot fail.
        let _ = self.latency_us.add(&other.latency_us);
    }
}

/// The most keys whose admissions are counted one by one (`allowed_per_key` in `--json`): 8
/// bytes each.
pub(crate) const MAX_KEYS_COUNTED: usize = 65_536;

/// What every connection shares.
#[derive(Debug)]
pub(crate) struct Shared {
    start: Instant,
    /// Allowed decisions per key number, with at most [`MAX_KEYS_COUNTED`] keys (else empty).
    allowed_per_key: Vec<AtomicU64>,
    /// Requests accounted for so far, and errors among them (for the progress bar).
    pub(crate) done: AtomicU64,
    pub(crate) errors: AtomicU64,
    /// Per-second tallies, by second since the start.
    seconds: Mutex<Vec<Tally>>,
    /// The first error seen, shown in the report so a wrong command is obvious.
    first_error: Mutex<Option<String>>,
}

impl Shared {
    /// For a run over `keys` keys.
    pub(crate) fn new(start: Instant, keys: usize) -> Shared {
        let counted = if keys <= MAX_KEYS_COUNTED { keys } else { 0 };
        Shared {
            start,
            allowed_per_key: (0..counted).map(|_| AtomicU64::new(0)).collect(),
            done: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            seconds: Mutex::new(Vec::new()),
            first_error: Mutex::new(None),
        }
    }

    /// The per-second tallies, one for each second up to `elapsed` (empty seconds included).
    pub(crate) fn seconds(&self, elapsed: Duration) -> Vec<Tally> {
        let mut seconds = lock(&self.seconds).clone();
        let len = usize::try_from(elapsed.as_secs()).unwrap_or(usize::MAX) + usize::from(elapsed.subsec_nanos() > 0);
        while seconds.len() < len {
            seconds.push(Tally::second());
        }
        seconds
    }

    /// Allowed decisions per key number, if the run had at most [`MAX_KEYS_COUNTED`] keys.
    pub(crate) fn allowed_per_key(&self) -> Option<Vec<u64>> {
        (!self.allowed_per_key.is_empty())
            .then(|| self.allowed_per_key.iter().map(|n| n.load(Ordering::Relaxed)).collect())
    }

    pub(crate) fn first_error(&self) -> Option<String> {
        lock(&self.first_error).clone()
    }

    fn merge_second(&self, second: usize, tally: &Tally) {
        let mut seconds = lock(&self.seconds);
        while seconds.len() <= second {
            seconds.push(Tally::second());
        }
        seconds[second].merge(tally);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panicking connection task cannot leave a tally half-updated in a way that matters.
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One connection's recorder.
#[derive(Debug)]
pub(crate) struct Recorder {
    shared: std::sync::Arc<Shared>,
    total: Tally,
    /// The second being filled and its tally.
    second: usize,
    current: Tally,
}

impl Recorder {
    pub(crate) fn new(shared: std::sync::Arc<Shared>) -> Recorder {
        Recorder { shared, total: Tally::total(), second: 0, current: Tally::second() }
    }

    /// Records one request for key number `key` due at `due` whose outcome was known at `now`.
    pub(crate) fn record_key(&mut self, key: u64, due: Instant, now: Instant, outcome: Result<Answer, Failure>) {
        if let Ok(Answer::Allowed) = outcome
            && let Some(count) = usize::try_from(key).ok().and_then(|k| self.shared.allowed_per_key.get(k))
        {
            count.fetch_add(1, Ordering::Relaxed);
        }
        self.record(due, now, outcome);
    }

    /// Records one request due at `due` whose outcome was known at `now`.
    pub(crate) fn record(&mut self, due: Instant, now: Instant, outcome: Result<Answer, Failure>) {
        let latency = match outcome {
            Ok(_) | Err(Failure::Reply(_)) => Some(now.saturating_duration_since(due)),
            Err(_) => None,
        };
        let second = usize::try_from(now.saturating_duration_since(self.shared.start).as_secs()).unwrap_or(usize::MAX);
        if second != self.second {
            self.flush();
            self.second = second;
        }
        self.total.record(latency, &outcome);
        self.current.record(latency, &outcome);
        self.shared.done.fetch_add(1, Ordering::Relaxed);
        if let Err(failure) = outcome {
            self.shared.errors.fetch_add(1, Ordering::Relaxed);
            let mut first = lock(&self.shared.first_error);
            if first.is_none() {
                *first = Some(match failure {
                    Failure::Reply(text) => format!("error reply: {text}"),
                    Failure::Transport(text) => text,
                    Failure::Timeout => "no reply within --timeout".to_string(),
                });
            }
        }
    }

    fn flush(&mut self) {
        if self.current.requests > 0 {
            self.shared.merge_second(self.second, &self.current);
            self.current = Tally::second();
        }
    }

    /// This connection's tally, its last second merged into the timeline.
    pub(crate) fn finish(mut self) -> Tally {
        self.flush();
        self.total
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn recorders_merge_into_totals_and_seconds() {
        let start = Instant::now();
        let shared = Arc::new(Shared::new(start, 1));
        let mut a = Recorder::new(shared.clone());
        let mut b = Recorder::new(shared.clone());
        let ms = Duration::from_millis;
        a.record(start, start + ms(2), Ok(Answer::Allowed));
        a.record(start, start + ms(1500), Ok(Answer::Denied));
        b.record(start + ms(10), start + ms(20), Err(Failure::Reply("ERR x".into())));
        b.record(start, start + ms(3200), Err(Failure::Timeout));
        let mut total = a.finish();
        total.merge(&b.finish());
        assert_eq!((total.requests, total.allowed, total.denied, total.errors()), (4, 1, 1, 2));
        // A timeout has no latency; an error reply has one.
        assert_eq!(total.latency_us.len(), 3);
        assert_eq!(shared.first_error().as_deref(), Some("error reply: ERR x"));
        let seconds = shared.seconds(ms(3500));
        assert_eq!(seconds.len(), 4);
        let per_second: Vec<_> = seconds.iter().map(|s| (s.requests, s.errors())).collect();
        assert_eq!(per_second, [(2, 1), (1, 0), (0, 0), (1, 1)]);
        assert_eq!(shared.done.load(Ordering::Relaxed), 4);
        assert_eq!(shared.errors.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn admissions_are_counted_per_key_up_to_a_bound() {
        let start = Instant::now();
        let shared = Arc::new(Shared::new(start, 3));
        let mut a = Recorder::new(shared.clone());
        for (key, outcome) in [(0, Ok(Answer::Allowed)), (2, Ok(Answer::Allowed)), (2, Ok(Answer::Allowed))] {
            a.record_key(key, start, start, outcome);
        }
        a.record_key(1, start, start, Ok(Answer::Denied));
        a.record_key(1, start, start, Err(Failure::Timeout));
        a.record_key(7, start, start, Ok(Answer::Allowed));
        assert_eq!(shared.allowed_per_key(), Some(vec![1, 0, 2]));
        assert_eq!(a.finish().allowed, 4, "the total counts every key");
        assert_eq!(Shared::new(start, MAX_KEYS_COUNTED + 1).allowed_per_key(), None);
    }
}
