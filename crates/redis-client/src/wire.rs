//! One server's connection, batching (auto-pipelining, as rueidis, Lettuce and ioredis do): the
//! calls ready in the same instant go out in one write, and the replies of one read complete
//! their calls in one pass, with no task woken per call in between.
//!
//! - **Two tasks.** The *writer* waits for a call, lets the tasks running in the same instant add
//!   theirs (one yield), then takes every call queued, encodes them into one buffer and writes it
//!   (one system call for all). The *reader* reads what the server sends, finds where each reply
//!   ends with the bounded framing (`bounded.rs`: no reply takes more than its bounds), parses
//!   each reply once, whole, and completes the calls in the order they were written.
//! - **Written at most once.** A call whose caller gave up before it was written is not written
//!   (it never runs). A call written keeps its place among the replies whether or not its caller
//!   still waits, so that the replies after it reach their own calls. The connection never sends
//!   a call again.
//! - **Ended whole.** A connection lost or closed, a reply past its bounds, one that is not RESP,
//!   or one that no call awaits ends the connection: every call written and not answered fails
//!   with an I/O error saying it may have run (its caller never sends it again: see
//!   [`Delivery`](crate::Delivery), and the store's `redis/across.rs` and `fallback/pending.rs`), and so does every call queued behind them. The error is one that
//!   makes the next call connect again (see `link.rs`), and both tasks end with the connection (a
//!   write blocked by a server that reads nothing too), closing the socket.
//! - **Stalls ended.** A connection whose calls await replies and whose reader has read no byte
//!   for the *stall* (counted from the last byte read, or from the oldest call's write if that
//!   is later) ends as above: a half-open link (a partition dropping packets, no reset), or a
//!   server that reads and never answers, would otherwise hold the socket until the kernel gives
//!   up (some 15 minutes of retransmissions), and the next call would never get a new one. The
//!   stall is [`stall_after`] the call timeout: twenty call timeouts, at least 2 s (1 s and 2 s
//!   are the longest any caller waits on a reply: a probe, a diagnosis). Long enough that a slow
//!   but live server (a 200 ms script, a busy server answering late) keeps its connection,
//!   since any byte it sends restarts the count; short enough that a partition recovers within
//!   seconds; and since every caller has given up by then (the stall is past every deadline), it
//!   fails no call a caller still awaits. An idle connection (no call awaited) is never ended.
//! - **Bounded.** A reply is at most [`MAX_REPLY_BYTES`](crate::bounded::MAX_REPLY_BYTES) in
//!   memory; a write carries at most [`MAX_WRITE`] bytes of calls (more go in the next one), and
//!   at most [`MAX_QUEUED`] calls; at most [`MAX_QUEUED`] calls wait for the writer (a server
//!   that reads nothing blocks it): more callers wait for room, each within its own deadline, and
//!   one that gives up leaves nothing. At most [`MAX_AWAITED`] calls are written and unanswered
//!   (a server that reads and never answers, before the stall): a write that would pass it ends
//!   the connection as above (the calls of that write fail as not sent). A live server has that
//!   many unanswered only when it is a third of a second behind at 200,000 calls a second, long
//!   past the default call timeout of every caller waiting.
//! - **Pushes skipped.** A push frame (`>`, RESP3's out-of-band message) answers no call: it is
//!   dropped, never taken for the reply of the call at the front.

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Poll;
use std::time::Duration;

use redis::{Cmd, ErrorKind, RedisError, RedisResult, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::bounded::{Framing, refusal};

/// The most bytes of calls one write carries.
const MAX_WRITE: usize = 1 << 20;

/// The most calls queued for the writer; more callers wait for room, each within its deadline.
const MAX_QUEUED: usize = 4096;

/// The least [`stall_after`] gives (see the module docs).
const MIN_STALL: Duration = Duration::from_secs(2);

/// How long a connection whose calls await replies may read nothing before it is ended as
/// stalled, for calls timing out after `call_timeout`: twenty call timeouts, at least
/// [`MIN_STALL`] (see the module docs).
pub(crate) fn stall_after(call_timeout: Duration) -> Duration {
    call_timeout.saturating_mul(20).max(MIN_STALL)
}

/// The most calls written and awaiting replies: past it, the connection ends (see the module
/// docs).
const MAX_AWAITED: usize = 1 << 16;

/// What the error of a call that was never written says (see [`Delivery`](crate::Delivery)).
pub(crate) const NOT_SENT: &str = "(the call was not sent)";

/// The room a read is given at least.
const READ_CHUNK: usize = 16 << 10;

/// The replies of one call, in order (a server's error reply is a [`Value::ServerError`]).
type Replies = RedisResult<Vec<Value>>;

/// A call queued: its commands, packed, and how many replies it awaits.
struct Call {
    packed: Vec<u8>,
    replies: usize,
    done: oneshot::Sender<Replies>,
    /// Counts the calls held, queued or being batched (what the tests bound).
    #[cfg(test)]
    _held: tests::Held,
}

/// A call written, awaiting its replies.
struct Awaited {
    /// When it was handed to the socket (the stall of a connection idle till then counts from
    /// here).
    since: Instant,
    left: usize,
    values: Vec<Value>,
    done: oneshot::Sender<Replies>,
}

/// Why a connection ended, as the calls it fails say it.
#[derive(Clone)]
struct Ended {
    kind: io::ErrorKind,
    why: String,
}

impl Ended {
    /// The error of a call written and not answered.
    fn may_have_run(&self) -> RedisError {
        io::Error::new(self.kind, format!("{} (the call may have run)", self.why)).into()
    }

    /// The error of a call never written.
    fn not_sent(&self) -> RedisError {
        io::Error::new(self.kind, format!("{} {NOT_SENT}", self.why)).into()
    }
}

/// The calls written and not answered yet, in the order they were written; `Err` once the
/// connection has ended (and then `ended` is set, read without the lock).
struct InFlight {
    calls: Mutex<Result<VecDeque<Awaited>, Ended>>,
    ended: AtomicBool,
    /// Wakes the writer blocked on a server that reads nothing, once the connection has ended.
    ending: Notify,
}

impl InFlight {
    fn lock(&self) -> std::sync::MutexGuard<'_, Result<VecDeque<Awaited>, Ended>> {
        self.calls.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Completes once the connection has ended.
    async fn until_ended(&self) {
        let mut ending = pin!(self.ending.notified());
        // Registered before `ended` is read: an end after the read wakes it.
        ending.as_mut().enable();
        if !self.ended.load(Ordering::Acquire) {
            ending.await;
        }
    }
}

/// A server's connection (see the module docs): cheap to clone, every clone on the same socket.
#[derive(Clone)]
pub(crate) struct Wire {
    calls: mpsc::Sender<Call>,
    in_flight: Arc<InFlight>,
    #[cfg(test)]
    held: Arc<std::sync::atomic::AtomicUsize>,
}

/// The tasks driving one connection, ended with it.
pub(crate) struct Tasks {
    writer: AbortHandle,
    reader: AbortHandle,
}

impl Drop for Tasks {
    fn drop(&mut self) {
        self.writer.abort();
        self.reader.abort();
    }
}

impl Wire {
    /// The connection over `read` and `write` (the two halves of one socket), its tasks started;
    /// ended once its calls have awaited replies with nothing read for `stall`.
    pub(crate) fn start<R, W>(read: R, write: W, stall: Duration) -> (Wire, Tasks)
    where
        R: AsyncRead + Send + Unpin + 'static,
        W: AsyncWrite + Send + Unpin + 'static,
    {
        let (calls, queued) = mpsc::channel(MAX_QUEUED);
        let in_flight = Arc::new(InFlight {
            calls: Mutex::new(Ok(VecDeque::new())),
            ended: AtomicBool::new(false),
            ending: Notify::new(),
        });
        let writer = tokio::spawn(write_calls(write, queued, in_flight.clone())).abort_handle();
        let reader = tokio::spawn(read_replies(read, in_flight.clone(), stall)).abort_handle();
        #[cfg(test)]
        let held = Arc::default();
        (
            Wire {
                calls,
                in_flight,
                #[cfg(test)]
                held,
            },
            Tasks { writer, reader },
        )
    }

    /// Sends `packed` (`replies` commands, packed one after the other, written together) and
    /// returns their replies.
    pub(crate) async fn call(&self, packed: Vec<u8>, replies: usize) -> Replies {
        let (done, answer) = oneshot::channel();
        let call = Call {
            packed,
            replies: replies.max(1),
            done,
            #[cfg(test)]
            _held: tests::Held::new(&self.held),
        };
        // Waits for room while the queue is full (a server that reads nothing, or slower than
        // its callers): the caller's deadline bounds the wait, and a call that gives up waiting
        // is neither queued nor written.
        if self.calls.send(call).await.is_err() {
            // The writer has ended with the connection: the call fails with the connection's end.
            return Err(ended_as(&self.in_flight).not_sent());
        }
        match answer.await {
            Ok(replies) => replies,
            // The connection's tasks ended with the call queued or written.
            Err(_) => Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the connection ended before the call's reply (the call may have run)",
            )
            .into()),
        }
    }

    /// Whether the connection has ended (lost, closed by the server, or refused a reply): a call
    /// on it would fail unsent.
    pub(crate) fn has_ended(&self) -> bool {
        self.in_flight.ended.load(Ordering::Acquire)
    }

    /// Sends `cmd` and returns its reply, a server's error reply as an error.
    pub(crate) async fn run(&self, cmd: &Cmd) -> RedisResult<Value> {
        last(self.call(cmd.get_packed_command(), 1).await?)
    }
}

/// The last of `replies`, a server's error reply as an error.
pub(crate) fn last(mut replies: Vec<Value>) -> RedisResult<Value> {
    replies.pop().ok_or_else(|| RedisError::from((ErrorKind::Parse, "no reply")))?.extract_error()
}

/// Ends the connection: every call written and not answered fails, and so does every call
/// written after this (the writer learns it when it registers them).
fn end(in_flight: &InFlight, ended: Ended) {
    let mut state = in_flight.lock();
    in_flight.ended.store(true, Ordering::Release);
    let awaited = std::mem::replace(&mut *state, Err(ended.clone()));
    drop(state);
    in_flight.ending.notify_waiters();
    if let Ok(awaited) = awaited {
        for call in awaited {
            let _ = call.done.send(Err(ended.may_have_run()));
        }
    }
}

/// `work`'s outcome, or `None` if `stop` completes first (`work` is then dropped: it must be
/// cancel-safe).
async fn unless<T>(work: impl Future<Output = T>, stop: impl Future<Output = ()>) -> Option<T> {
    let (mut work, mut stop) = (pin!(work), pin!(stop));
    std::future::poll_fn(|cx| {
        if let Poll::Ready(done) = work.as_mut().poll(cx) {
            return Poll::Ready(Some(done));
        }
        stop.as_mut().poll(cx).map(|()| None)
    })
    .await
}

/// The kind of error a connection that ends with `kind` fails its calls with: one that makes the
/// next call connect again (a lost connection, for the driver's error types).
fn dropped(kind: io::ErrorKind) -> io::ErrorKind {
    use io::ErrorKind::*;
    match kind {
        BrokenPipe | ConnectionReset | ConnectionRefused | ConnectionAborted | UnexpectedEof | NotConnected => kind,
        _ => ConnectionAborted,
    }
}

/// The writer (see the module docs).
async fn write_calls<W: AsyncWrite + Unpin>(mut socket: W, mut queued: mpsc::Receiver<Call>, in_flight: Arc<InFlight>) {
    let mut buffer = Vec::new();
    let mut batch = Vec::new();
    let ended = loop {
        // The writer ends with the connection (the reader's end closes the socket's other half).
        let Some(first) = unless(queued.recv(), in_flight.until_ended()).await else {
            break ended_as(&in_flight);
        };
        let Some(first) = first else {
            // No handle left: nothing more to send.
            return;
        };
        // The callers running in this instant queue their calls before the write.
        tokio::task::yield_now().await;
        buffer.clear();
        let since = Instant::now();
        let mut next = Some(first);
        while let Some(call) = next.take() {
            // A call whose caller gave up is not written: it never runs.
            if !call.done.is_closed() {
                buffer.extend_from_slice(&call.packed);
                batch.push(Awaited {
                    since,
                    left: call.replies,
                    values: Vec::with_capacity(call.replies),
                    done: call.done,
                });
            }
            // At most a queue's worth of calls a write: one batch never passes MAX_AWAITED alone.
            if buffer.len() < MAX_WRITE && batch.len() < MAX_QUEUED {
                next = queued.try_recv().ok();
            }
        }
        if batch.is_empty() {
            continue;
        }
        // Awaited before written: the reader may read their replies as soon as they are written.
        let refused = match &mut *in_flight.lock() {
            // A server that reads and never answers: the calls it holds end with the connection
            // rather than pile up until the stall.
            Ok(awaited) if awaited.len() + batch.len() > MAX_AWAITED => {
                let why = format!(
                    "{} calls written and unanswered, and {} more to write (at most {MAX_AWAITED}): a server that reads \
                     and does not answer",
                    awaited.len(),
                    batch.len()
                );
                Some((Ended { kind: io::ErrorKind::ConnectionAborted, why }, true))
            }
            Ok(awaited) => {
                awaited.extend(batch.drain(..));
                None
            }
            Err(ended) => Some((ended.clone(), false)),
        };
        if let Some((ended, ends_now)) = refused {
            if ends_now {
                end(&in_flight, ended.clone());
            }
            for call in batch.drain(..) {
                let _ = call.done.send(Err(ended.not_sent()));
            }
            break ended;
        }
        let written = async {
            socket.write_all(&buffer).await?;
            socket.flush().await
        };
        // A write blocked by a server that reads nothing ends with the connection (the reader
        // ends it once the stall has passed).
        match unless(written, in_flight.until_ended()).await {
            Some(Ok(())) => {}
            Some(Err(error)) => {
                let ended = Ended { kind: dropped(error.kind()), why: format!("cannot write to the server: {error}") };
                end(&in_flight, ended.clone());
                break ended;
            }
            None => break ended_as(&in_flight),
        }
        if buffer.capacity() > 2 * MAX_WRITE {
            buffer = Vec::new();
        }
    };
    // The calls still queued were never written.
    queued.close();
    while let Ok(call) = queued.try_recv() {
        let _ = call.done.send(Err(ended.not_sent()));
    }
}

/// Why the connection ended (once it has).
fn ended_as(in_flight: &InFlight) -> Ended {
    match &*in_flight.lock() {
        Err(ended) => ended.clone(),
        Ok(_) => Ended { kind: io::ErrorKind::NotConnected, why: "the connection has ended".into() },
    }
}

/// What the reader's stall watch finds.
enum Watch {
    /// Calls have awaited replies with nothing read for the stall: the connection ends.
    Stalled(Ended),
    /// Nothing to end before this instant.
    Until(Instant),
    /// The connection has ended already (the writer's doing).
    Over,
}

/// Whether the connection has stalled: calls awaiting replies, nothing read for `stall` since
/// the last byte read (`last_read`) or, if later, since the oldest of them was written.
fn watch(in_flight: &InFlight, last_read: Instant, stall: Duration) -> Watch {
    let state = in_flight.lock();
    let Ok(awaited) = &*state else { return Watch::Over };
    let now = Instant::now();
    let Some(oldest) = awaited.front() else { return Watch::Until(after(now, stall)) };
    let quiet_since = oldest.since.max(last_read);
    if now.saturating_duration_since(quiet_since) < stall {
        return Watch::Until(after(quiet_since, stall));
    }
    let why = format!(
        "no reply from the server for {stall:?} with {} calls awaiting theirs (a lost link, or a server that no \
         longer answers)",
        awaited.len()
    );
    Watch::Stalled(Ended { kind: io::ErrorKind::ConnectionAborted, why })
}

/// `by` after `at`, or a year after it if that is past what an instant holds.
fn after(at: Instant, by: Duration) -> Instant {
    at.checked_add(by).unwrap_or_else(|| at + Duration::from_secs(365 * 86_400))
}

/// The reader (see the module docs).
async fn read_replies<R: AsyncRead + Unpin>(mut socket: R, in_flight: Arc<InFlight>, stall: Duration) {
    let mut framing = Framing::default();
    let mut buffer: Vec<u8> = Vec::with_capacity(READ_CHUNK);
    let mut ends = Vec::new();
    let mut values = Vec::new();
    let mut last_read = Instant::now();
    // Fires at the earliest instant the connection could have stalled, and is set again then.
    let mut stall_watch = pin!(tokio::time::sleep_until(after(last_read, stall)));
    let ended = loop {
        buffer.reserve(READ_CHUNK);
        let from = buffer.len();
        // `read_buf` is cancel-safe: a read cut short by the watch has read nothing.
        let Some(read) = unless(socket.read_buf(&mut buffer), stall_watch.as_mut()).await else {
            match watch(&in_flight, last_read, stall) {
                Watch::Stalled(ended) => break ended,
                Watch::Until(at) => {
                    stall_watch.as_mut().reset(at);
                    continue;
                }
                Watch::Over => return,
            }
        };
        last_read = Instant::now();
        match read {
            Ok(0) => {
                break Ended { kind: io::ErrorKind::UnexpectedEof, why: "connection closed by the server".into() };
            }
            Ok(_) => {}
            Err(error) => {
                break Ended { kind: dropped(error.kind()), why: format!("cannot read from the server: {error}") };
            }
        }
        let framed = framing.split(&buffer[from..], |end| ends.push(from + end));
        let mut start = 0;
        let mut unparsed = None;
        for &end in &ends {
            match crate::reply::parse(&buffer[start..end]) {
                // A push (RESP3's out-of-band frame, which a RESP2 connection never asks for)
                // answers no call: skipped, so that it shifts no reply onto another call.
                Ok(Value::Push { .. }) => {}
                Ok(value) => values.push(value),
                Err(error) => {
                    unparsed = Some(refusal(&format!("a reply that is not RESP ({error})")));
                    break;
                }
            }
            start = end;
        }
        ends.clear();
        buffer.drain(..start);
        // The replies read whole are their calls', even when what follows them is not RESP.
        if !values.is_empty()
            && let Err(ended) = complete(&in_flight, &mut values)
        {
            break ended;
        }
        // The first thing that is not RESP ends the connection: a frame that does not parse comes
        // before what could not be framed.
        if let Some(error) = unparsed.or_else(|| framed.err().map(|what| refusal(&what))) {
            break Ended { kind: error.kind(), why: error.to_string() };
        }
    };
    end(&in_flight, ended);
}

/// Gives `values` (replies read, in order) to the calls awaiting them, in the order they were
/// written; a reply that no call awaits ends the connection.
fn complete(in_flight: &InFlight, values: &mut Vec<Value>) -> Result<(), Ended> {
    let mut answered = Vec::new();
    let mut outcome = Ok(());
    {
        let mut state = in_flight.lock();
        let Ok(awaited) = &mut *state else { return Ok(()) };
        for value in values.drain(..) {
            let Some(call) = awaited.front_mut() else {
                let error = refusal(&unawaited(&value));
                outcome = Err(Ended { kind: error.kind(), why: error.to_string() });
                break;
            };
            call.values.push(value);
            call.left -= 1;
            if call.left == 0 {
                answered.extend(awaited.pop_front());
            }
        }
    }
    // Completed outside the lock: the writer registers the next calls meanwhile.
    for call in answered {
        let _ = call.done.send(Ok(call.values));
    }
    outcome
}

/// What a reply that no call awaits is said to be: an error reply quoted (a server refusing the
/// connection says why before it closes it: `-ERR max number of clients reached`), cut short.
fn unawaited(value: &Value) -> String {
    let Value::ServerError(error) = value else { return "a reply that no call awaits".into() };
    let mut said = format!("{} {}", error.code(), error.details().unwrap_or_default());
    if said.len() > 200 {
        let cut = (0..=200).rev().find(|&i| said.is_char_boundary(i)).unwrap_or(0);
        said.truncate(cut);
        said.push('…');
    }
    format!("an error that no call awaits ({said:?})")
}

#[cfg(test)]
mod tests;
