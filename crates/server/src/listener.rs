//! What the RESP and HTTP listeners share: accepting until shutdown, a cap on open connections
//! (a connection beyond it is handed back to be refused in the protocol's words), each
//! connection on its own task, and on shutdown a grace period after which the connections still
//! open are closed, whatever their clients do.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;

/// A bound listener and the connections it has spawned.
pub(crate) struct Listener {
    listener: TcpListener,
    slots: Arc<Semaphore>,
    connections: JoinSet<()>,
    shutdown: watch::Receiver<bool>,
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
        Listener { listener, slots: Arc::new(Semaphore::new(max_connections)), connections: JoinSet::new(), shutdown }
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

    /// Serves a connection on its own task.
    pub(crate) fn spawn(&mut self, connection: impl Future<Output = ()> + Send + 'static) {
        self.connections.spawn(connection);
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
