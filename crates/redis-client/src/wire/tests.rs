//! The connection against a scripted server on an in-memory pipe: replies cut and merged across
//! reads, a connection lost with calls in flight, a reply past its bounds, callers that give up,
//! and calls ready together written together.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream, ReadHalf, WriteHalf};

use super::*;

/// A stall no test but the stall's own reaches.
const PATIENT: Duration = Duration::from_secs(3600);

/// A connection over a pipe, and the server's end of it.
fn connected() -> (Wire, Tasks, DuplexStream) {
    connected_with(PATIENT)
}

/// A connection over a pipe ended after `stall` without a reply, and the server's end of it.
fn connected_with(stall: Duration) -> (Wire, Tasks, DuplexStream) {
    let (client, server) = tokio::io::duplex(1 << 20);
    let (read, write) = tokio::io::split(client);
    let (wire, tasks) = Wire::start(read, write, stall);
    (wire, tasks, server)
}

/// Reads from `server` until it has received `count` commands (each `GET <name>` packed: `*2`
/// lines); returns the names, in order.
async fn received(server: &mut (impl AsyncRead + Unpin), count: usize, seen: &mut Vec<u8>) -> Vec<String> {
    loop {
        let names = names_in(seen);
        if names.len() >= count {
            return names;
        }
        let mut chunk = [0u8; 4096];
        let n = server.read(&mut chunk).await.unwrap();
        assert!(n > 0, "the client closed the connection");
        seen.extend_from_slice(&chunk[..n]);
    }
}

/// The names of the `GET`s in `bytes` (a stream of packed commands).
fn names_in(bytes: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(bytes);
    let lines: Vec<&str> = text.split("\r\n").collect();
    lines.windows(5).filter(|w| w[0] == "*2" && w[2] == "GET").map(|w| w[4].to_string()).collect()
}

fn get(name: &str) -> Cmd {
    redis::cmd("GET").arg(name).clone()
}

/// A bulk string reply.
fn bulk(text: &str) -> String {
    format!("${}\r\n{text}\r\n", text.len())
}

fn text(value: &Value) -> String {
    match value {
        Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        other => format!("{other:?}"),
    }
}

#[tokio::test]
async fn replies_cut_or_merged_across_reads_reach_their_own_calls() {
    let (wire, _tasks, mut server) = connected();
    let calls = spawn_gets(&wire, 20);
    let mut seen = Vec::new();
    let names = received(&mut server, 20, &mut seen).await;
    // Every reply answers with its call's name, a nested array among them; all in one stream,
    // written one byte at a time for the first half and merged in one write for the rest.
    let replies: Vec<String> = names
        .iter()
        .enumerate()
        .map(|(i, name)| if i % 5 == 0 { format!("*2\r\n{}*1\r\n:{i}\r\n", bulk(name)) } else { bulk(name) })
        .collect();
    let (first, rest) = replies.split_at(10);
    for byte in first.concat().as_bytes() {
        server.write_all(std::slice::from_ref(byte)).await.unwrap();
        tokio::task::yield_now().await;
    }
    server.write_all(rest.concat().as_bytes()).await.unwrap();
    for (i, call) in calls.into_iter().enumerate() {
        let reply = call.await.unwrap().unwrap();
        let name = format!("key{i}");
        match reply {
            Value::Array(values) => assert_eq!(text(&values[0]), name),
            other => assert_eq!(text(&other), name),
        }
    }
}

/// `count` calls `GET key<i>` on `wire`, each on a task of its own.
fn spawn_gets(wire: &Wire, count: usize) -> Vec<tokio::task::JoinHandle<RedisResult<Value>>> {
    (0..count)
        .map(|i| {
            let wire = wire.clone();
            tokio::spawn(async move { wire.run(&get(&format!("key{i}"))).await })
        })
        .collect()
}

#[tokio::test]
async fn a_connection_lost_with_calls_in_flight_fails_them_as_may_have_run_and_never_sends_them_again() {
    let (wire, tasks, mut server) = connected();
    let calls = spawn_gets(&wire, 3);
    let mut seen = Vec::new();
    let names = received(&mut server, 3, &mut seen).await;
    // The first is answered, then the server's side closes before the others' replies.
    server.write_all(bulk(&names[0]).as_bytes()).await.unwrap();
    server.shutdown().await.unwrap();
    let mut replies = Vec::new();
    for call in calls {
        replies.push(call.await.unwrap());
    }
    let answered: Vec<&Value> = replies.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(answered.len(), 1, "{replies:?}");
    for error in replies.iter().filter_map(|r| r.as_ref().err()) {
        assert!(error.to_string().contains("may have run"), "{error}");
        // What makes the caller treat it as a call that may have run, and connect again.
        assert!(error.is_io_error() && error.is_unrecoverable_error(), "{error:?}");
    }
    // A call after the end is refused, unsent.
    let late = wire.run(&get("late")).await.unwrap_err();
    assert!(late.to_string().contains("not sent") && late.is_unrecoverable_error(), "{late}");
    drop((wire, tasks));
    // What the server received, to the end: each call once, the late one never.
    server.read_to_end(&mut seen).await.unwrap();
    assert_eq!(names_in(&seen), ["key0", "key1", "key2"]);
}

#[tokio::test]
async fn a_reply_past_its_bounds_ends_the_connection_and_fails_its_calls() {
    for (reply, named) in [
        ("$9999999999\r\n", "a string of 9999999999 bytes"),
        ("*2147483647\r\n", "2147483647 values in one reply"),
        ("?what\r\n", "unknown type"),
        // Framed as a reply, yet not one the parser reads.
        (":abc\r\n", "not RESP"),
    ] {
        let (wire, _tasks, mut server) = connected();
        let calls = spawn_gets(&wire, 2);
        let mut seen = Vec::new();
        received(&mut server, 2, &mut seen).await;
        server.write_all(reply.as_bytes()).await.unwrap();
        for call in calls {
            let error = call.await.unwrap().unwrap_err();
            let text = error.to_string();
            assert!(text.contains(named) && text.contains("refused, and its connection ended"), "{reply:?}: {text}");
            assert!(error.is_unrecoverable_error(), "{reply:?}: {error:?}");
        }
    }
}

#[tokio::test]
async fn a_reply_that_no_call_awaits_ends_the_connection() {
    let (wire, _tasks, mut server) = connected();
    let calls = spawn_gets(&wire, 1);
    let mut seen = Vec::new();
    received(&mut server, 1, &mut seen).await;
    server.write_all(format!("{}{}", bulk("key0"), bulk("unasked")).as_bytes()).await.unwrap();
    assert_eq!(text(&calls.into_iter().next().unwrap().await.unwrap().unwrap()), "key0");
    let next = wire.run(&get("next")).await.unwrap_err();
    assert!(
        next.to_string().contains("a reply that no call awaits") || next.to_string().contains("not sent"),
        "{next}"
    );
}

#[tokio::test]
async fn a_call_whose_caller_gave_up_keeps_its_place_among_the_replies() {
    let (wire, _tasks, mut server) = connected();
    let mut seen = Vec::new();
    // The first call is written, then its caller gives up before the reply.
    let first = get("key0");
    let gave_up = tokio::time::timeout(Duration::from_millis(20), wire.run(&first));
    let (abandoned, names) = tokio::join!(gave_up, received(&mut server, 1, &mut seen));
    assert!(abandoned.is_err() && names == ["key0"]);
    let next = tokio::spawn({
        let wire = wire.clone();
        async move { wire.run(&get("key1")).await }
    });
    let names = received(&mut server, 2, &mut seen).await;
    assert_eq!(names, ["key0", "key1"]);
    // The replies, in order: the abandoned call's first.
    server.write_all(format!("{}{}", bulk("key0"), bulk("key1")).as_bytes()).await.unwrap();
    assert_eq!(text(&next.await.unwrap().unwrap()), "key1");
}

#[tokio::test]
async fn a_call_whose_caller_gave_up_before_it_was_written_is_never_sent() {
    let (wire, _tasks, mut server) = connected();
    // Queued and abandoned within one poll: the writer finds its caller gone.
    let cmd = get("abandoned");
    let mut abandoned = Box::pin(wire.run(&cmd));
    let pending = std::future::poll_fn(|cx| Poll::Ready(abandoned.as_mut().poll(cx).is_pending())).await;
    assert!(pending);
    drop(abandoned);
    let kept = spawn_gets(&wire, 1).pop().unwrap();
    let mut seen = Vec::new();
    let names = received(&mut server, 1, &mut seen).await;
    assert_eq!(names, ["key0"]);
    server.write_all(bulk("key0").as_bytes()).await.unwrap();
    assert_eq!(text(&kept.await.unwrap().unwrap()), "key0");
}

/// A writer that counts its writes.
struct Counted<W> {
    inner: W,
    writes: Arc<AtomicUsize>,
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Counted<W> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[tokio::test]
async fn calls_ready_together_go_out_in_one_write() {
    let (client, mut server) = tokio::io::duplex(1 << 20);
    let (read, write): (ReadHalf<DuplexStream>, WriteHalf<DuplexStream>) = tokio::io::split(client);
    let writes = Arc::new(AtomicUsize::new(0));
    let (wire, _tasks) = Wire::start(read, Counted { inner: write, writes: writes.clone() }, PATIENT);
    // Fifty callers made ready in the same instant (one poll of the runtime each).
    let calls = spawn_gets(&wire, 50);
    let mut seen = Vec::new();
    let names = received(&mut server, 50, &mut seen).await;
    assert_eq!(writes.load(Ordering::Relaxed), 1, "fifty calls ready together, one write");
    let replies: String = names.iter().map(|n| bulk(n)).collect();
    server.write_all(replies.as_bytes()).await.unwrap();
    for (i, call) in calls.into_iter().enumerate() {
        assert_eq!(text(&call.await.unwrap().unwrap()), format!("key{i}"));
    }
}

/// Counts a call while it is held by the connection, queued or being batched.
pub(super) struct Held(Arc<AtomicUsize>);

impl Held {
    pub(super) fn new(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Held(count.clone())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A push (RESP3's out-of-band frame: an invalidation, a message) answers no call: taken for
/// one, it would shift every later reply onto the call after its own.
#[tokio::test]
async fn a_push_frame_is_no_calls_reply() {
    let (wire, _tasks, mut server) = connected();
    let calls = spawn_gets(&wire, 2);
    let mut seen = Vec::new();
    let names = received(&mut server, 2, &mut seen).await;
    let push = format!(">2\r\n{}*1\r\n{}", bulk("invalidate"), bulk("key0"));
    server.write_all(format!("{push}{}{push}{}", bulk(&names[0]), bulk(&names[1])).as_bytes()).await.unwrap();
    for (i, call) in calls.into_iter().enumerate() {
        assert_eq!(text(&call.await.unwrap().unwrap()), format!("key{i}"));
    }
    // The connection goes on.
    let next = spawn_gets(&wire, 1).pop().unwrap();
    received(&mut server, 3, &mut seen).await;
    server.write_all(bulk("key0").as_bytes()).await.unwrap();
    assert_eq!(text(&next.await.unwrap().unwrap()), "key0");
}

/// A server that reads nothing (frozen, or its host gone) blocks the writer: callers keep coming
/// and give up at their deadlines, and the calls they leave must not pile up without bound.
#[tokio::test]
async fn callers_outpacing_a_server_that_reads_nothing_hold_a_bounded_queue() {
    // A pipe of 64 bytes: the first write blocks, the server reading nothing.
    let (client, mut server) = tokio::io::duplex(64);
    let (read, write) = tokio::io::split(client);
    let (wire, _tasks) = Wire::start(read, write, PATIENT);
    // A call longer than the pipe blocks the writer; the callers come after.
    let blocking = tokio::spawn({
        let wire = wire.clone();
        async move { wire.run(&get(&"x".repeat(1000))).await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(wire.held.load(Ordering::Relaxed), 0, "the first call is taken by the writer");
    let callers = 3 * MAX_QUEUED;
    let gave_up: Vec<_> = (0..callers)
        .map(|i| {
            let wire = wire.clone();
            tokio::spawn(async move {
                tokio::time::timeout(Duration::from_millis(50), wire.run(&get(&format!("key{i}")))).await.is_err()
            })
        })
        .collect();
    for caller in gave_up {
        assert!(caller.await.unwrap(), "a caller was answered by a server that answers nothing");
    }
    let held = wire.held.load(Ordering::Relaxed);
    assert!(held <= MAX_QUEUED, "{held} calls held for {callers} callers that gave up (at most {MAX_QUEUED})");
    // The server reads again and answers: a new call gets its own reply (those written before
    // keep their places; the rest were never written).
    let next = tokio::spawn({
        let wire = wire.clone();
        async move { wire.run(&get("next")).await }
    });
    let mut seen = Vec::new();
    let names = loop {
        let mut chunk = [0u8; 4096];
        let n = server.read(&mut chunk).await.unwrap();
        seen.extend_from_slice(&chunk[..n]);
        let names = names_in(&seen);
        if names.last().is_some_and(|n| n == "next") {
            break names;
        }
    };
    let replies: String = names.iter().map(|n| bulk(n)).collect();
    server.write_all(replies.as_bytes()).await.unwrap();
    assert_eq!(text(&next.await.unwrap().unwrap()), "next");
    assert_eq!(text(&blocking.await.unwrap().unwrap()), "x".repeat(1000));
}

#[cfg(feature = "testkit")]
mod against_redis;

mod stalls;
