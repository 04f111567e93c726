//! The RESP listener: accepts connections up to the limit and serves each on its own task; on
//! shutdown, lets them finish what they received for a grace period, then closes them.

pub mod commands;
mod connection;

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::app::App;
use crate::config::RespBounds;
use crate::listener::{Accepted, Listener};

/// Serves RESP on `listener` until `shutdown` turns true, then lets every connection finish the
/// commands it has already read, for at most `grace`, and returns.
pub async fn serve(
    listener: TcpListener,
    app: Arc<App>,
    bounds: RespBounds,
    grace: std::time::Duration,
    shutdown: watch::Receiver<bool>,
) {
    let mut listener = Listener::new(listener, bounds.max_connections, shutdown.clone());
    while let Some(accepted) = listener.next().await {
        let (stream, peer, slot) = match accepted {
            Accepted::Slot(stream, peer, slot) => (stream, peer, slot),
            Accepted::Full(stream) => {
                app.metrics().connections_refused.inc();
                // A few bytes into an empty socket buffer: never waits on the client.
                let _ = stream.try_write(b"-ERR max number of clients reached\r\n");
                continue;
            }
        };
        app.metrics().connections_total.inc();
        app.metrics().connections.inc();
        let (app, shutdown) = (app.clone(), shutdown.clone());
        listener.spawn(async move {
            if let Err(error) = connection::serve(stream, &app, bounds, shutdown).await {
                tracing::debug!(%peer, %error, "connection closed");
            }
            app.metrics().connections.dec();
            drop(slot);
        });
    }
    listener.drain(grace, "RESP").await;
}
