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
        let written = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.stall.check(cx, written)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let flushed = Pin::new(&mut self.stream).poll_flush(cx);
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
            let bounded = Bounded { stream, _slot: slot, deadline, received: 0, activity, idle, stall };
            return Some((Ok(bounded), (listener, slots)));
        }
    })
}
