//! What the RESP and HTTP listeners share: accepting until shutdown, a cap on open connections
//! (a connection beyond it is handed back to be refused in the protocol's words), each
//! connection on its own task (on the runtime that accepted it, or on the next of the
//! [`Workers`]), and on shutdown a grace period after which the connections still
//! open are closed, whatever their clients do. And for a connection whose protocol code writes
//! through `poll_write` (gRPC's), a bound on how long a write may wait on a client that reads
//! nothing ([`WriteStall`]).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;
use tokio::time::Sleep;

use crate::workers::Workers;

/// A bound listener and the connections it has spawned.
pub(crate) struct Listener {
    listener: TcpListener,
    slots: Arc<Semaphore>,
    connections: JoinSet<()>,
    shutdown: watch::Receiver<bool>,
    workers: Workers,
}

/// An accepted connection (`TCP_NODELAY` set).
pub(crate) enum Accepted {
    /// Within the cap: serve it, holding the slot until it closes.
    Slot(TcpStream, SocketAddr, OwnedSemaphorePermit),
    /// Beyond the cap: refuse it without waiting on the client.
    Full(TcpStream),
}

impl Listener {
    pub(crate) fn new(listener: TcpListener, max_connections: usize, shutdown: watch::Receiver<bool>) -> Self {
        Listener {
            listener,
            slots: Arc::new(Semaphore::new(max_connections)),
            connections: JoinSet::new(),
            shutdown,
            workers: Workers::default(),
        }
    }

    /// The same, its connections served on `workers` in turn.
    pub(crate) fn on(mut self, workers: Workers) -> Self {
        self.workers = workers;
        self
    }

    /// The next connection; `None` once shutdown has begun.
    pub(crate) async fn next(&mut self) -> Option<Accepted> {
        loop {
            let accepted = tokio::select! {
                accepted = self.listener.accept() => accepted,
                _ = self.shutdown.wait_for(|&stop| stop) => return None,
            };
            // Reap finished connections so the set does not grow with the server's lifetime.
            while self.connections.try_join_next().is_some() {}
            match accepted {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    return Some(match self.slots.clone().try_acquire_owned() {
                        Ok(slot) => Accepted::Slot(stream, peer, slot),
                        Err(_) => Accepted::Full(stream),
                    });
                }
                Err(error) => {
                    // Out of file descriptors and the like: wait a moment rather than spin.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }

    /// Serves `stream` with `serve` on a task of its own, on the next worker if there are any.
    pub(crate) fn serve<F, Fut>(&mut self, stream: TcpStream, serve: F)
    where
        F: FnOnce(TcpStream) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.workers.spawn(&mut self.connections, stream, serve);
    }

    /// Waits at most `grace` for the connections to finish, then closes those still open.
    pub(crate) async fn drain(mut self, grace: Duration, protocol: &str) {
        let connections = &mut self.connections;
        let drained = tokio::time::timeout(grace, async { while connections.join_next().await.is_some() {} }).await;
        if drained.is_err() {
            tracing::warn!(
                left = self.connections.len(),
                "{protocol} connections still busy after the grace period: closed"
            );
            self.connections.shutdown().await;
        }
    }
}

/// How long a connection's writes may wait on its client: a write that makes no progress for
/// the bound fails (`TimedOut`), which ends the connection. A client that reads nothing would
/// otherwise hold it for ever once the socket's buffers are full: the protocol code waits on the
/// write, reads no more (so no idle bound is checked), and cannot even write its goodbye.
pub(crate) struct WriteStall {
    bound: Duration,
    /// When the write waiting since the last progress fails.
    deadline: Option<Pin<Box<Sleep>>>,
}

impl WriteStall {
    pub(crate) fn new(bound: Duration) -> Self {
        WriteStall { bound, deadline: None }
    }

    /// A write's (or a flush's) outcome, bounded: one that is ready forgets the stall; one that
    /// waits starts it (its deadline registered with `cx`) and fails once it has lasted the
    /// bound.
    pub(crate) fn check<T>(
        &mut self,
        cx: &mut Context<'_>,
        written: Poll<std::io::Result<T>>,
    ) -> Poll<std::io::Result<T>> {
        if written.is_ready() {
            self.deadline = None;
            return written;
        }
        let bound = self.bound;
        let deadline = self.deadline.get_or_insert_with(|| Box::pin(tokio::time::sleep(bound)));
        match deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("the client read nothing for {} ms", bound.as_millis()),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}
