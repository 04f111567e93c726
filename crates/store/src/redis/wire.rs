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
//!   with an I/O error saying it may have run (its caller never sends it again: see `across.rs`
//!   and `fallback/pending.rs`), and so does every call queued behind them. The error is one that
//!   makes the next call connect again (see `link.rs`).
//! - **Bounded.** A reply is at most [`MAX_REPLY_BYTES`](super::bounded::MAX_REPLY_BYTES) in
//!   memory; a write carries at most [`MAX_WRITE`] bytes of calls (more go in the next one); at
//!   most [`MAX_QUEUED`] calls wait for the writer (a server that reads nothing blocks it): more
//!   callers wait for room, each within its own deadline, and one that gives up leaves nothing.
//! - **Pushes skipped.** A push frame (`>`, RESP3's out-of-band message) answers no call: it is
//!   dropped, never taken for the reply of the call at the front.

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use redis::{Cmd, ErrorKind, RedisError, RedisResult, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;

use super::bounded::{Framing, refusal};

/// The most bytes of calls one write carries.
const MAX_WRITE: usize = 1 << 20;

/// The most calls queued for the writer; more callers wait for room, each within its deadline.
const MAX_QUEUED: usize = 4096;

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
        io::Error::new(self.kind, format!("{} (the call was not sent)", self.why)).into()
    }
}

/// The calls written and not answered yet, in the order they were written; `Err` once the
/// connection has ended (and then `ended` is set, read without the lock).
struct InFlight {
    calls: Mutex<Result<VecDeque<Awaited>, Ended>>,
    ended: AtomicBool,
}

impl InFlight {
    fn lock(&self) -> std::sync::MutexGuard<'_, Result<VecDeque<Awaited>, Ended>> {
        self.calls.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A server's connection (see the module docs): cheap to clone, every clone on the same socket.
#[derive(Clone)]
pub(super) struct Wire {
    calls: mpsc::Sender<Call>,
    in_flight: Arc<InFlight>,
    #[cfg(test)]
    held: Arc<std::sync::atomic::AtomicUsize>,
}

/// The tasks driving one connection, ended with it.
pub(super) struct Tasks {
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
    /// The connection over `read` and `write` (the two halves of one socket), its tasks started.
    pub(super) fn start<R, W>(read: R, write: W) -> (Wire, Tasks)
    where
        R: AsyncRead + Send + Unpin + 'static,
        W: AsyncWrite + Send + Unpin + 'static,
    {
        let (calls, queued) = mpsc::channel(MAX_QUEUED);
        let in_flight = Arc::new(InFlight { calls: Mutex::new(Ok(VecDeque::new())), ended: AtomicBool::new(false) });
        let writer = tokio::spawn(write_calls(write, queued, in_flight.clone())).abort_handle();
        let reader = tokio::spawn(read_replies(read, in_flight.clone())).abort_handle();
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
    pub(super) async fn call(&self, packed: Vec<u8>, replies: usize) -> Replies {
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
            return Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "the connection has ended (the call was not sent)",
            )
            .into());
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
    pub(super) fn has_ended(&self) -> bool {
        self.in_flight.ended.load(Ordering::Acquire)
    }

    /// Sends `cmd` and returns its reply, a server's error reply as an error.
    pub(super) async fn run(&self, cmd: &Cmd) -> RedisResult<Value> {
        last(self.call(cmd.get_packed_command(), 1).await?)
    }
}

/// The last of `replies`, a server's error reply as an error.
pub(super) fn last(mut replies: Vec<Value>) -> RedisResult<Value> {
    replies.pop().ok_or_else(|| RedisError::from((ErrorKind::Parse, "no reply")))?.extract_error()
}

/// Ends the connection: every call written and not answered fails, and so does every call
/// written after this (the writer learns it when it registers them).
fn end(in_flight: &InFlight, ended: Ended) {
    let mut state = in_flight.lock();
    in_flight.ended.store(true, Ordering::Release);
    if let Ok(awaited) = std::mem::replace(&mut *state, Err(ended.clone())) {
        drop(state);
        for call in awaited {
            let _ = call.done.send(Err(ended.may_have_run()));
        }
    }
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
        let Some(first) = queued.recv().await else {
            // No handle left: nothing more to send.
            return;
        };
        // The callers running in this instant queue their calls before the write.
        tokio::task::yield_now().await;
        buffer.clear();
        let mut next = Some(first);
        while let Some(call) = next.take() {
            // A call whose caller gave up is not written: it never runs.
            if !call.done.is_closed() {
                buffer.extend_from_slice(&call.packed);
                batch.push(Awaited { left: call.replies, values: Vec::with_capacity(call.replies), done: call.done });
            }
            if buffer.len() < MAX_WRITE {
                next = queued.try_recv().ok();
            }
        }
        if batch.is_empty() {
            continue;
        }
        // Awaited before written: the reader may read their replies as soon as they are written.
        let refused = match &mut *in_flight.lock() {
            Ok(awaited) => {
                awaited.extend(batch.drain(..));
                None
            }
            Err(ended) => Some(ended.clone()),
        };
        if let Some(ended) = refused {
            for call in batch.drain(..) {
                let _ = call.done.send(Err(ended.not_sent()));
            }
            break ended;
        }
        let written = async {
            socket.write_all(&buffer).await?;
            socket.flush().await
        };
        if let Err(error) = written.await {
            let ended = Ended { kind: dropped(error.kind()), why: format!("cannot write to the server: {error}") };
            end(&in_flight, ended.clone());
            break ended;
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

/// The reader (see the module docs).
async fn read_replies<R: AsyncRead + Unpin>(mut socket: R, in_flight: Arc<InFlight>) {
    let mut framing = Framing::default();
    let mut buffer: Vec<u8> = Vec::with_capacity(READ_CHUNK);
    let mut ends = Vec::new();
    let mut values = Vec::new();
    let ended = loop {
        buffer.reserve(READ_CHUNK);
        let from = buffer.len();
        match socket.read_buf(&mut buffer).await {
            Ok(0) => {
                break Ended { kind: io::ErrorKind::UnexpectedEof, why: "connection closed by the server".into() };
            }
            Ok(_) => {}
            Err(error) => {
                break Ended { kind: dropped(error.kind()), why: format!("cannot read from the server: {error}") };
            }
        }
        if let Err(what) = framing.split(&buffer[from..], |end| ends.push(from + end)) {
            let error = refusal(&what);
            break Ended { kind: error.kind(), why: error.to_string() };
        }
        let mut start = 0;
        let mut unparsed = None;
        for &end in &ends {
            match redis::parse_redis_value(&buffer[start..end]) {
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
        if let Some(error) = unparsed {
            break Ended { kind: error.kind(), why: error.to_string() };
        }
        buffer.drain(..start);
        if !values.is_empty()
            && let Err(ended) = complete(&in_flight, &mut values)
        {
            break ended;
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
