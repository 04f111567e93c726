//! When each request is due: the tickets every connection takes from, in order.
//!
//! Closed loop: a ticket is due when it is taken (a connection sends as soon as a reply frees a
//! slot). Open loop (`--rate R`): ticket `i` is due at `start + i / R` whatever happened before,
//! and its latency is measured from that instant, so a stall that delays sends shows in the
//! latency of every request it delayed rather than being hidden by sending fewer requests
//! (coordinated omission).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// When the run stops issuing requests.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Stop {
    /// After this many requests.
    Requests(u64),
    /// Requests due at or after this long from the start are not sent.
    After(Duration),
}

/// How early an open-loop request may be sent: tokio's timers fire on a 1 ms wheel, so a request
/// woken exactly at its due instant would leave up to 1 ms late and charge that to the server.
/// Sent early, its latency runs from when it was sent.
pub(crate) const SEND_EARLY: Duration = Duration::from_millis(1);

/// One request to send.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ticket {
    /// When it is due (open loop) or was taken (closed loop).
    pub(crate) due: Instant,
}

impl Ticket {
    /// When to wake up to send it.
    pub(crate) fn wake(self) -> Instant {
        self.due.checked_sub(SEND_EARLY).unwrap_or(self.due)
    }

    /// Whether it may be sent at `now`.
    pub(crate) fn ready(self, now: Instant) -> bool {
        self.wake() <= now
    }

    /// Where its latency starts if it is sent at `sent`: its due instant, or when it was sent if
    /// that was earlier.
    pub(crate) fn start(self, sent: Instant) -> Instant {
        self.due.min(sent)
    }
}

/// The shared source of tickets.
#[derive(Debug)]
pub(crate) struct Schedule {
    start: Instant,
    stop: Stop,
    /// Requests per second in the open loop; `None` for the closed loop.
    rate: Option<f64>,
    taken: AtomicU64,
}

impl Schedule {
    pub(crate) fn new(start: Instant, stop: Stop, rate: Option<f64>) -> Schedule {
        Schedule { start, stop, rate, taken: AtomicU64::new(0) }
    }

    pub(crate) fn start(&self) -> Instant {
        self.start
    }

    pub(crate) fn is_open_loop(&self) -> bool {
        self.rate.is_some()
    }

    /// The next ticket, or `None` once the run has issued everything it will.
    pub(crate) fn take(&self, now: Instant) -> Option<Ticket> {
        if self.finished(now) {
            return None;
        }
        let index = self.taken.fetch_add(1, Ordering::Relaxed);
        // An open-loop ticket due beyond what an `Instant` can hold is past any stop.
        let due = match self.rate {
            None => Some(now),
            Some(rate) => self.after(index, rate),
        };
        let over = match (self.stop, due) {
            (_, None) => true,
            (Stop::Requests(n), _) => index >= n,
            (Stop::After(limit), Some(due)) => due >= self.start + limit,
        };
        if over {
            // Keep the count from running on past the bound (and wrapping in a very long run).
            self.taken.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        due.map(|due| Ticket { due })
    }

    /// Whether no further ticket will be issued (a closed loop past its duration).
    fn finished(&self, now: Instant) -> bool {
        match self.stop {
            Stop::Requests(n) => self.taken.load(Ordering::Relaxed) >= n,
            Stop::After(limit) => self.rate.is_none() && now >= self.start + limit,
        }
    }

    /// When the last ticket is due, for the progress bar: the duration, or `n / rate`.
    pub(crate) fn planned_length(&self) -> Option<Duration> {
        match (self.stop, self.rate) {
            (Stop::After(limit), _) => Some(limit),
            (Stop::Requests(n), Some(rate)) => Duration::try_from_secs_f64(n as f64 / rate).ok(),
            (Stop::Requests(_), None) => None,
        }
    }

    /// When open-loop ticket `index` is due.
    fn after(&self, index: u64, rate: f64) -> Option<Instant> {
        self.start.checked_add(Duration::try_from_secs_f64(index as f64 / rate).ok()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_loop_issues_exactly_n_tickets_across_threads() {
        let schedule = std::sync::Arc::new(Schedule::new(Instant::now(), Stop::Requests(10_000), None));
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let schedule = schedule.clone();
                std::thread::spawn(move || {
                    let mut n = 0u64;
                    while schedule.take(Instant::now()).is_some() {
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        let total: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(total, 10_000);
    }

    #[test]
    fn open_loop_tickets_are_due_on_the_rate_whenever_they_are_taken() {
        let start = Instant::now();
        let schedule = Schedule::new(start, Stop::After(Duration::from_secs(1)), Some(1000.0));
        // Taken late (a stall): still due at their own instants.
        let late = start + Duration::from_secs(5);
        let dues: Vec<_> = std::iter::from_fn(|| schedule.take(late)).map(|t| t.due - start).collect();
        assert_eq!(dues.len(), 1000);
        assert_eq!(dues[0], Duration::ZERO);
        assert_eq!(dues[1], Duration::from_millis(1));
        assert_eq!(dues[999], Duration::from_millis(999));
        assert_eq!(schedule.planned_length(), Some(Duration::from_secs(1)));
    }

    #[test]
    fn latency_starts_at_the_due_instant_or_the_earlier_send() {
        let due = Instant::now() + Duration::from_secs(1);
        let ticket = Ticket { due };
        assert_eq!(ticket.wake(), due - SEND_EARLY);
        assert!(!ticket.ready(due - SEND_EARLY * 2) && ticket.ready(due - SEND_EARLY));
        assert_eq!(ticket.start(due - SEND_EARLY), due - SEND_EARLY);
        assert_eq!(ticket.start(due + Duration::from_secs(5)), due, "a late send is charged from its due instant");
    }

    #[test]
    fn a_closed_loop_with_a_duration_stops_at_its_end() {
        let start = Instant::now();
        let schedule = Schedule::new(start, Stop::After(Duration::from_secs(1)), None);
        assert!(schedule.take(start).is_some());
        assert!(schedule.take(start + Duration::from_secs(1)).is_none());
    }
}
