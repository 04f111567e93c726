//! The gRPC listener's connections, bounded before tonic sees them: at most `max_connections` at
//! once (one more is closed as soon as it is accepted), each must send the HTTP/2 preface within
//! `header_read_timeout` (a connection that sends nothing holds no slot for long), and each is
//! closed once it has had no request under way for `idle_timeout` (see `idle.rs`: a client that
//! answers keepalive PINGs and sends nothing else gives its slot back too), and a write that
//! makes no progress for `write_stall` (the keepalive timeout) fails, closing it: a client that
//! reads nothing cannot answer a PING either, but hyper's keepalive cannot close its connection
//! (it reads no more while its writes wait, and its GOAWAY would wait too). Concurrent streams,
//! request time, keepalive and message size are tonic's settings (see `serve`).
//!
//! An idle connection is closed as if its client had: its reads end, and with no stream open
//! HTTP/2 ends the connection cleanly (no GOAWAY: tonic gives no handle on one connection). A
//! request a client sends at that very moment fails, and its client connects again.
//!
//! Responses finished together go out in one write: hyper runs each stream in a task of its own,
//! and on the work-stealing runtime the task that finishes a response wakes the connection's task
//! into its worker's LIFO slot, so the connection ran right after each response and wrote it
//! alone (one `writev` per call on a connection with 64 streams in flight, as Envoy sends them;
//! on a single-threaded runtime, where a woken task waits its turn, 0.02). So the first write
//! after a flush yields once ([`Bounded::defer_write`]): the connection's task goes behind the
//! tasks already runnable, and the responses they finish meanwhile share the write.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tonic::transport::server::Connected;

use super::idle::{Activity, ConnectionInfo};
use crate::listener::WriteStall;

/// The HTTP/2 client preface (RFC 9113 section 3.4) is 24 bytes.
const PREFACE: usize = 24;

/// An accepted connection holding its slot, closed if its preface is late or once it is idle.
pub(super) struct Bounded {
    stream: TcpStream,
    _slot: OwnedSemaphorePermit,
    /// Until the preface has arrived.
    deadline: Option<Pin<Box<Sleep>>>,
    received: usize,
    activity: Arc<Activity>,
    /// The idle bound, and a timer that checks it.
    idle: Option<(Duration, Pin<Box<Sleep>>)>,
    /// How long a write may wait on the client.
    stall: WriteStall,
    /// Whether this flush's write has yielded already (see the module docs).
    write_deferred: bool,
}

impl Bounded {
    /// Whether the connection has had no request under way for the idle bound; otherwise the
    /// timer is set to when it would have (and registered with `cx`).
    fn idle_past_bound(&mut self, cx: &mut Context<'_>) -> bool {
        let Some((bound, timer)) = &mut self.idle else { return false };
        while timer.as_mut().poll(cx).is_ready() {
            let now = Instant::now();
            match self.activity.idle_since() {
                Some(since) if now.saturating_duration_since(since) >= *bound => return true,
                Some(since) => timer.as_mut().reset(since + *bound),
                // A request under way: look again a bound from now (its end restarts the count).
                None => timer.as_mut().reset(now + *bound),
            }
        }
        false
    }

    /// Whether a write should wait: the first one after a flush yields once (the task woken
    /// at once, so queued behind the tasks already runnable), and the flush's later writes go
    /// out as they come.
    fn defer_write(&mut self, cx: &mut Context<'_>) -> bool {
        if self.write_deferred {
            return false;
        }
        self.write_deferred = true;
        cx.waker().wake_by_ref();
        true
    }
}

impl AsyncRead for Bounded {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                this.received += buf.filled().len() - before;
                if this.received >= PREFACE {
                    this.deadline = None;
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
            Poll::Pending => match this.deadline.as_mut().map(|d| d.as_mut().poll(cx)) {
                Some(Poll::Ready(())) => Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the HTTP/2 preface did not arrive in time",
                ))),
                // Nothing to read now: an idle connection ends here, as if its client closed it.
                _ if this.idle_past_bound(cx) => Poll::Ready(Ok(())),
                _ => Poll::Pending,
            },
        }
    }
}

impl AsyncWrite for Bounded {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        if self.defer_write(cx) {
            return Poll::Pending;
        }
        let written = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.stall.check(cx, written)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let flushed = Pin::new(&mut self.stream).poll_flush(cx);
        if flushed.is_ready() {
            self.write_deferred = false;
        }
        self.stall.check(cx, flushed)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        if self.defer_write(cx) {
            return Poll::Pending;
        }
        let written = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.stall.check(cx, written)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

impl Connected for Bounded {
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> ConnectionInfo {
        ConnectionInfo { tcp: self.stream.connect_info(), activity: Arc::clone(&self.activity) }
    }
}

/// The connections of `listener`, bounded as the module says.
pub(super) fn incoming(
    listener: TcpListener,
    max_connections: usize,
    header_read_timeout: Duration,
    idle_timeout: Option<Duration>,
    write_stall: Duration,
) -> impl Stream<Item = std::io::Result<Bounded>> {
    let slots = Arc::new(Semaphore::new(max_connections));
    futures_util::stream::unfold((listener, slots), move |(listener, slots)| async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                // A failed accept (out of file descriptors...) is the listener's to survive.
                Err(error) => {
                    tracing::warn!(%error, "gRPC accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                tracing::debug!("gRPC connection refused: --grpc-max-connections reached");
                continue;
            };
            let _ = stream.set_nodelay(true);
            let deadline = Some(Box::pin(tokio::time::sleep(header_read_timeout)));
            let idle = idle_timeout.map(|bound| (bound, Box::pin(tokio::time::sleep(bound))));
            let activity = Activity::new();
            let stall = WriteStall::new(write_stall);
            let bounded =
                Bounded { stream, _slot: slot, deadline, received: 0, activity, idle, stall, write_deferred: false };
            return Some((Ok(bounded), (listener, slots)));
        }
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Wake, Waker};

    use futures_util::StreamExt;
    use tokio::io::AsyncReadExt;

    use super::*;

    /// Counts its wake-ups.
    #[derive(Default)]
    struct Wakes(AtomicUsize);

    impl Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[tokio::test]
    async fn the_first_write_after_a_flush_yields_once_and_the_rest_go_out_as_they_come() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let long = Duration::from_secs(60);
        let mut incoming = std::pin::pin!(incoming(listener, 1, long, None, long));
        let mut served = incoming.next().await.unwrap().unwrap();
        let wakes = Arc::new(Wakes::default());
        let waker = Waker::from(Arc::clone(&wakes));
        let mut cx = Context::from_waker(&waker);
        let mut served = Pin::new(&mut served);

        let first = served.as_mut().poll_write(&mut cx, b"one ");
        assert!(
            first.is_pending(),
            "the first write went out at once ({first:?}): responses finished meanwhile would each take a write of their own"
        );
        assert_eq!(wakes.0.load(Ordering::Relaxed), 1, "the connection's task is woken to write on its next turn");
        assert!(
            matches!(served.as_mut().poll_write(&mut cx, b"one "), Poll::Ready(Ok(4))),
            "on its next turn it writes"
        );
        assert!(
            matches!(served.as_mut().poll_write(&mut cx, b"two "), Poll::Ready(Ok(4))),
            "the flush's later writes do not wait"
        );
        assert!(matches!(served.as_mut().poll_flush(&mut cx), Poll::Ready(Ok(()))));
        assert_eq!(wakes.0.load(Ordering::Relaxed), 1);

        // After a flush, the next write yields again: once.
        let slices = [std::io::IoSlice::new(b"three")];
        assert!(served.as_mut().poll_write_vectored(&mut cx, &slices).is_pending());
        assert_eq!(wakes.0.load(Ordering::Relaxed), 2);
        assert!(matches!(served.as_mut().poll_write_vectored(&mut cx, &slices), Poll::Ready(Ok(5))));
        assert!(matches!(served.as_mut().poll_flush(&mut cx), Poll::Ready(Ok(()))));

        let mut received = vec![0u8; 13];
        client.read_exact(&mut received).await.unwrap();
        assert_eq!(received, b"one two three", "every byte written once, in order");
    }
}
