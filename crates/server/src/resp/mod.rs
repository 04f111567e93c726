//! The RESP listener: accepts connections up to the limit and serves each on its own task.

pub mod commands;
mod connection;
pub mod frame;
pub mod reply;

use std::sync::Arc;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

use crate::engine::Engine;
use frame::Bounds;

/// Serves RESP on `listener` until `shutdown` turns true, then lets every connection finish the
/// commands it has already read and returns.
pub async fn serve(
    listener: TcpListener,
    engine: Arc<Engine>,
    bounds: Bounds,
    max_connections: usize,
    mut shutdown: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(max_connections));
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.wait_for(|&stop| stop) => break,
        };
        // Reap finished connections so the set does not grow with the server's lifetime.
        while connections.try_join_next().is_some() {}
        let (mut stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(error) => {
                // Out of file descriptors and the like: wait a moment rather than spin.
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            engine.metrics().connections_refused.inc();
            let _ = stream.write_all(b"-ERR max number of clients reached\r\n").await;
            continue;
        };
        engine.metrics().connections_total.inc();
        engine.metrics().connections.inc();
        let (engine, shutdown) = (engine.clone(), shutdown.clone());
        connections.spawn(async move {
            if let Err(error) = connection::serve(stream, &engine, bounds, shutdown).await {
                tracing::debug!(%peer, %error, "connection closed");
            }
            engine.metrics().connections.dec();
            drop(slot);
        });
    }
    while connections.join_next().await.is_some() {}
}
