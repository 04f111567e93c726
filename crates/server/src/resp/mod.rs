//! The RESP listener: accepts connections up to the limit and serves each on its own task; on
//! shutdown, lets them finish what they received for a grace period, then closes them.

pub mod commands;
mod connection;
pub mod frame;
pub mod reply;

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

use crate::app::App;
use crate::config::RespBounds;

/// Serves RESP on `listener` until `shutdown` turns true, then lets every connection finish the
/// commands it has already read, for at most `grace`, and returns.
pub async fn serve(
    listener: TcpListener,
    app: Arc<App>,
    bounds: RespBounds,
    grace: std::time::Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(bounds.max_connections));
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.wait_for(|&stop| stop) => break,
        };
        // Reap finished connections so the set does not grow with the server's lifetime.
        while connections.try_join_next().is_some() {}
        let (stream, peer) = match accepted {
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
            app.metrics().connections_refused.inc();
            // A few bytes into an empty socket buffer: never waits on the client.
            let _ = stream.try_write(b"-ERR max number of clients reached\r\n");
            continue;
        };
        app.metrics().connections_total.inc();
        app.metrics().connections.inc();
        let (app, shutdown) = (app.clone(), shutdown.clone());
        connections.spawn(async move {
            if let Err(error) = connection::serve(stream, &app, bounds, shutdown).await {
                tracing::debug!(%peer, %error, "connection closed");
            }
            app.metrics().connections.dec();
            drop(slot);
        });
    }
    let drained = tokio::time::timeout(grace, async { while connections.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::warn!(left = connections.len(), "RESP connections still busy after the grace period: closed");
        connections.shutdown().await;
    }
}
