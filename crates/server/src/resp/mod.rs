//! The RESP listener: accepts connections up to the limit and serves each on its own task (on
//! the next of the [`Workers`] if there are any); on shutdown, lets them finish what they
//! received for a grace period, then closes them.

mod batch;
pub mod commands;
mod connection;

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::app::App;
use crate::config::RespBounds;
use crate::listener::{Accepted, Listener};
use crate::workers::Workers;

/// Serves RESP on `listener` until `shutdown` turns true, then lets every connection finish the
/// commands it has already read, for at most `grace`, and returns. Connections run on `workers`
/// in turn (none: on this runtime).
pub async fn serve(
    listener: TcpListener,
    app: Arc<App>,
    bounds: RespBounds,
    grace: std::time::Duration,
    shutdown: watch::Receiver<bool>,
    workers: Workers,
) {
    let mut listener = Listener::new(listener, bounds.max_connections, shutdown.clone()).on(workers);
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
        let (app, shutdown) = (app.clone(), shutdown.clone());
        listener.serve(stream, move |stream| async move {
            // Counted once served (a connection lost while handed to its worker never is).
            app.metrics().connections.inc();
            if let Err(error) = connection::serve(stream, &app, bounds, shutdown).await {
                tracing::debug!(%peer, %error, "connection closed");
            }
            app.metrics().connections.dec();
            drop(slot);
        });
    }
    listener.drain(grace, "RESP").await;
}
