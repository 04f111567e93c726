//! What one client can hold of an HTTP listener: its connection while it reads nothing
//! (`WriteTimeout`: a connection whose client accepts no response byte for `write_timeout` is
//! closed, as nginx's `send_timeout`, and reset, as nginx's `reset_timedout_connection`, so
//! that the kernel drops what it could not send), and, for `tollgate proxy`, its connections (a
//! cap per client address, [`PerClient`]; an IPv6 client is its /64, which it can rotate
//! through for free).

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::http::tls::Replay;
use crate::listener::WriteStall;

/// A client connection whose close can be made a reset.
pub(crate) trait Resettable {
    /// Makes closing the connection reset it (`SO_LINGER` 0): the kernel drops its unsent bytes
    /// at once.
    fn reset_on_close(&self);
}

impl Resettable for TcpStream {
    fn reset_on_close(&self) {
        let _ = self.set_zero_linger();
    }
}

impl Resettable for tokio_rustls::server::TlsStream<Replay> {
    fn reset_on_close(&self) {
        self.get_ref().0.tcp().reset_on_close();
    }
}

/// A stream whose writes fail with `TimedOut` once they have made no progress for its bound
/// (the listener's `write_timeout`; see [`WriteStall`]), and which is then reset when closed.
pub(crate) struct WriteTimeout<S> {
    inner: S,
    stall: WriteStall,
}

impl<S: Resettable> WriteTimeout<S> {
    pub(crate) fn new(inner: S, timeout: Duration) -> Self {
        WriteTimeout { inner, stall: WriteStall::new(timeout) }
    }

    fn guard<T>(&mut self, cx: &mut Context<'_>, poll: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        let waiting = poll.is_pending();
        let poll = self.stall.check(cx, poll);
        if waiting && poll.is_ready() {
            // Given up on. Closed the usual way, the socket would keep the bytes the client did
            // not take (megabytes) in the kernel for as long as it reads one now and then, with
            // its slot free for the next such connection.
            self.inner.reset_on_close();
        }
        poll
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteTimeout<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Resettable + Unpin> AsyncWrite for WriteTimeout<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.guard(cx, poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.guard(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_flush(cx);
        self.guard(cx, poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.guard(cx, poll)
    }
}

/// At most `max` connections per client address, except from the addresses `exempt` names
/// (trusted proxies: one of their connections carries many clients).
#[derive(Clone)]
pub struct PerClient {
    /// Most connections one client address holds at once.
    pub max: usize,
    /// Addresses whose connections are not counted.
    pub exempt: Arc<dyn Fn(IpAddr) -> bool + Send + Sync>,
}

impl std::fmt::Debug for PerClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PerClient").field("max", &self.max).finish_non_exhaustive()
    }
}

/// The open connections of each client address (an entry per address with one open at least:
/// never more entries than connections).
#[derive(Default)]
pub(crate) struct ClientCounts(Mutex<HashMap<IpAddr, usize>>);

/// One counted connection, given back when dropped.
pub(crate) struct ClientSlot {
    counts: Arc<ClientCounts>,
    client: IpAddr,
}

impl ClientCounts {
    /// A slot for a connection from `peer`, if its client holds fewer than `max`.
    pub(crate) fn acquire(self: &Arc<Self>, peer: IpAddr, max: usize) -> Option<ClientSlot> {
        let client = client_of(peer);
        let mut counts = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let count = counts.entry(client).or_insert(0);
        if *count >= max {
            return None;
        }
        *count += 1;
        Some(ClientSlot { counts: self.clone(), client })
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut counts = self.counts.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(count) = counts.get_mut(&self.client) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.client);
            }
        }
    }
}

/// The client a peer address stands for: an IPv4 address (an IPv4-mapped one too), or an IPv6
/// /64.
fn client_of(peer: IpAddr) -> IpAddr {
    match peer.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_each_client_up_to_its_cap_and_gives_slots_back() {
        let counts = Arc::new(ClientCounts::default());
        let ip = |text: &str| text.parse::<IpAddr>().unwrap();
        let first = counts.acquire(ip("203.0.113.7"), 2).unwrap();
        let _second = counts.acquire(ip("::ffff:203.0.113.7"), 2).expect("the same client, IPv4-mapped");
        assert!(counts.acquire(ip("203.0.113.7"), 2).is_none());
        assert!(counts.acquire(ip("203.0.113.8"), 2).is_some(), "another client");
        drop(first);
        assert!(counts.acquire(ip("203.0.113.7"), 2).is_some(), "a slot given back");
        let _a = counts.acquire(ip("2001:db8:0:1::1"), 1).unwrap();
        assert!(counts.acquire(ip("2001:db8:0:1:ffff::2"), 1).is_none(), "one /64");
        assert!(counts.acquire(ip("2001:db8:0:2::1"), 1).is_some(), "another /64");
    }
}
