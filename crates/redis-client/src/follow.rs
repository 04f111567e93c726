//! What following a topology takes, whatever the topology (a cluster's slot map, a Sentinel
//! group's primary):
//!
//! - **the servers connected now**, by address ([`Nodes`]): a server named again keeps its
//!   connection, and a server the topology no longer names is forgotten (its connection closed
//!   once its last call ends), so that years of failovers and rescheduled pods leave nothing
//!   behind;
//! - **candidates asked in parallel, known-good first** ([`ask_in_turn`]): the first at once,
//!   the next as soon as one fails or after [`STAGGER`] without an answer, all within one query
//!   timeout, so that a dead or silent server costs at most that, however many there are;
//! - **a re-read of the topology that is serialized and throttled** ([`Refresh`]): at most one per
//!   [`REFRESH_EVERY`] whatever asks for it (a failed call, a call that finds no server, the
//!   probe), so that a failing server or an incomplete map can never turn every call into a
//!   re-read.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;

use redis::RedisResult;

use crate::node::{Node, Settings};
use crate::target::Address;

/// The least time between two re-reads of the topology.
pub(crate) const REFRESH_EVERY: Duration = Duration::from_millis(100);

/// How long one candidate has to answer before the next one is asked too (a server that answers
/// at all does within a millisecond or two on a LAN: the next one is rarely asked).
pub(crate) const STAGGER: Duration = Duration::from_millis(20);

/// The servers connected now, by address: a server named again (a primary switched back, a
/// node the slot map names anew) keeps its connection, until the topology no longer names it.
pub(crate) struct Nodes {
    settings: Arc<Settings>,
    known: Mutex<HashMap<Address, Arc<Node>>>,
}

impl Nodes {
    pub(crate) fn new(settings: Arc<Settings>) -> Self {
        Nodes { settings, known: Mutex::new(HashMap::new()) }
    }

    /// The server at `address`, connected once (on first use).
    pub(crate) fn get(&self, address: &Address) -> RedisResult<Arc<Node>> {
        let mut known = self.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(node) = known.get(address) {
            return Ok(node.clone());
        }
        let node = Node::open(address.clone(), self.settings.clone())?;
        known.insert(address.clone(), node.clone());
        Ok(node)
    }

    /// Forgets every server but those `keep` names (a call under way keeps its server's
    /// connection until it ends).
    pub(crate) fn retain(&self, keep: impl Fn(&Address) -> bool) {
        self.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner).retain(|address, _| keep(address));
    }

    /// How long a topology query may take: the call timeout, at least 200 ms.
    pub(crate) fn query_timeout(&self) -> Duration {
        self.settings.timeout.max(Duration::from_millis(200))
    }
}

/// What [`ask_in_turn`] gathered when no candidate's answer was accepted.
pub(crate) struct Refused<C, E> {
    /// Each refusal, in the order they came.
    pub(crate) failures: Vec<E>,
    /// The candidates that had not answered within the time given (asked, or never reached).
    pub(crate) unanswered: Vec<C>,
}

/// Asks `candidates` in order with `ask` until one's answer is accepted (`Ok`): the first at
/// once, the next as soon as every one asked so far has failed or after [`STAGGER`] without an
/// accepted answer, all within `within` (the candidates still asked then are dropped, their
/// queries with them).
pub(crate) async fn ask_in_turn<C: Clone, T, E, F: Future<Output = Result<T, E>>>(
    candidates: impl IntoIterator<Item = C>,
    within: Duration,
    mut ask: impl FnMut(C) -> F,
) -> Result<T, Refused<C, E>> {
    let deadline = Instant::now() + within;
    let mut waiting: VecDeque<C> = candidates.into_iter().collect();
    let mut running: Vec<(C, Pin<Box<F>>)> = Vec::new();
    let mut failures = Vec::new();
    let mut end = Box::pin(tokio::time::sleep_until(deadline));
    let mut next = Box::pin(tokio::time::sleep(Duration::ZERO));
    enum Event<T, E> {
        Answer(usize, Result<T, E>),
        Next,
        End,
    }
    loop {
        let event = std::future::poll_fn(|cx| {
            for (i, (_, query)) in running.iter_mut().enumerate() {
                if let Poll::Ready(answer) = query.as_mut().poll(cx) {
                    return Poll::Ready(Event::Answer(i, answer));
                }
            }
            if end.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Event::End);
            }
            if !waiting.is_empty() && (running.is_empty() || next.as_mut().poll(cx).is_ready()) {
                return Poll::Ready(Event::Next);
            }
            Poll::Pending
        })
        .await;
        match event {
            Event::Answer(_, Ok(answer)) => return Ok(answer),
            Event::Answer(i, Err(failure)) => {
                running.swap_remove(i);
                failures.push(failure);
                // A failure asks the next candidate at once.
                next.as_mut().reset(Instant::now());
            }
            Event::Next => {
                if let Some(candidate) = waiting.pop_front() {
                    let query = Box::pin(ask(candidate.clone()));
                    running.push((candidate, query));
                    next.as_mut().reset(Instant::now() + STAGGER);
                }
            }
            Event::End => {
                let unanswered = running.into_iter().map(|(c, _)| c).chain(waiting).collect();
                return Err(Refused { failures, unanswered });
            }
        }
        if running.is_empty() && waiting.is_empty() {
            return Err(Refused { failures, unanswered: Vec::new() });
        }
    }
}

/// A re-read of the topology: serialized, and at most one per [`REFRESH_EVERY`].
#[derive(Default)]
pub(crate) struct Refresh {
    /// Held while re-reading; when the last re-read ended, and what it found.
    last: tokio::sync::Mutex<Option<(Instant, RedisResult<()>)>>,
}

impl Refresh {
    /// Runs `read`, unless another re-read ended after this was asked (its result is this one's)
    /// or within [`REFRESH_EVERY`]: then the last re-read's result is this one's at once, or,
    /// with `wait` (a call that cannot go on without a fresh read), `read` runs once
    /// [`REFRESH_EVERY`] has passed (the caller's deadline bounds the wait).
    pub(crate) async fn run<F: Future<Output = RedisResult<()>>>(
        &self,
        wait: bool,
        read: impl FnOnce() -> F,
    ) -> RedisResult<()> {
        let asked = Instant::now();
        let mut last = self.last.lock().await;
        if let Some((at, result)) = last.as_ref() {
            if *at >= asked {
                return result.clone();
            }
            let since = at.elapsed();
            if since < REFRESH_EVERY {
                if !wait {
                    return result.clone();
                }
                tokio::time::sleep(REFRESH_EVERY - since).await;
            }
        }
        let result = read().await;
        *last = Some((Instant::now(), result.clone()));
        result
    }

    /// Whether a re-read would run now: none runs, and none ended within [`REFRESH_EVERY`]
    /// (cheap enough to ask on every call).
    pub(crate) fn due(&self) -> bool {
        self.age().is_none_or(|age| age >= REFRESH_EVERY) && self.last.try_lock().is_ok()
    }

    /// How long ago the last re-read ended: `None` if none has, or one runs now.
    pub(crate) fn age(&self) -> Option<Duration> {
        self.last.try_lock().ok().and_then(|last| last.as_ref().map(|(at, _)| at.elapsed()))
    }
}

/// Runs `refresh` on a task of its own, if inside a tokio runtime.
pub(crate) fn in_background(refresh: impl Future<Output = ()> + Send + 'static) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(refresh);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A candidate that answers after `delay` (`None`: never), `Ok` if `good`.
    async fn answer(delay: Option<u64>, good: bool, name: &'static str) -> Result<&'static str, &'static str> {
        match delay {
            Some(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
            None => std::future::pending().await,
        }
        if good { Ok(name) } else { Err(name) }
    }

    #[tokio::test(start_paused = true)]
    async fn silent_candidates_cost_one_stagger_each_not_one_timeout() {
        let start = Instant::now();
        let candidates = [(None, false, "a"), (None, false, "b"), (Some(0), false, "c"), (Some(1), true, "d")];
        let asked = Mutex::new(Vec::new());
        let found = ask_in_turn(candidates, Duration::from_secs(30), |(delay, good, name)| {
            asked.lock().unwrap().push((name, start.elapsed()));
            answer(delay, good, name)
        })
        .await;
        assert_eq!(found.ok(), Some("d"));
        let asked = asked.into_inner().unwrap();
        let at = |ms| Duration::from_millis(ms);
        // a at once, b one stagger later, c one more, d as soon as c failed.
        assert_eq!(asked, [("a", at(0)), ("b", STAGGER), ("c", STAGGER * 2), ("d", STAGGER * 2)]);
        assert_eq!(start.elapsed(), STAGGER * 2 + at(1));
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_answer_wins_and_the_deadline_bounds_the_rest() {
        let fast = ask_in_turn([(Some(1), true, "a"), (Some(0), true, "b")], Duration::from_secs(1), |(d, g, n)| {
            answer(d, g, n)
        })
        .await;
        assert_eq!(fast.ok(), Some("a"), "a answers within the stagger: b is never asked");
        let start = Instant::now();
        let none = ask_in_turn(
            [(None, false, "a"), (Some(0), false, "b"), (None, false, "c")],
            Duration::from_millis(200),
            |(d, g, n)| answer(d, g, n),
        )
        .await;
        let Err(refused) = none else { panic!("no candidate answers") };
        assert_eq!(refused.failures, ["b"]);
        let unanswered: Vec<&str> = refused.unanswered.iter().map(|(_, _, n)| *n).collect();
        assert_eq!(unanswered, ["a", "c"]);
        assert_eq!(start.elapsed(), Duration::from_millis(200));
        let empty =
            ask_in_turn(Vec::<(Option<u64>, bool, &str)>::new(), Duration::from_secs(1), |(d, g, n)| answer(d, g, n))
                .await;
        assert!(matches!(empty, Err(Refused { failures, unanswered }) if failures.is_empty() && unanswered.is_empty()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_refresh_runs_at_most_once_per_interval() {
        let refresh = Refresh::default();
        let reads = std::sync::atomic::AtomicUsize::new(0);
        let read = || async {
            reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok(())
        };
        for _ in 0..50 {
            refresh.run(false, read).await.unwrap();
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // 500 ms of asking every 10 ms: one read per 100 ms (plus the first).
        assert_eq!(reads.load(std::sync::atomic::Ordering::Relaxed), 5);
        // A caller that must have a fresh read waits for its turn, and gets one.
        refresh.run(false, read).await.unwrap();
        let before = reads.load(std::sync::atomic::Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(1)).await;
        refresh.run(true, read).await.unwrap();
        assert_eq!(reads.load(std::sync::atomic::Ordering::Relaxed), before + 1);
    }
}
