//! Serving HTTP/1.1 with bounds, for `tollgate serve` and `tollgate proxy`: a header-read timeout
//! (slowloris), a timeout per request (body included: 408), a connection cap (503 and close
//! beyond it), a bound on the request head, and on shutdown a grace period after which the
//! connections still open are closed, whatever their clients do.
//!
//! hyper's own HTTP/1 connection does the protocol (hyper-util's timer gives it the header-read
//! timeout); the router is an axum `Router`, which also bounds bodies (413). The peer's address is
//! given to the router as axum's `ConnectInfo<SocketAddr>`; over TLS ([`Tls`]), the
//! connection's fingerprints as a `TlsFingerprint` extension too.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tower_service::Service;

use tokio::io::{AsyncRead, AsyncWrite};
use tollgate_tower::TlsFingerprint;

use crate::config::HttpBounds;
use crate::http::tls::Tls;
use crate::listener::{Accepted, Listener};

/// Answered, without reading the request, to a connection beyond the cap.
const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";

/// Serves `app` on `listener` (over TLS with `tls`) until `shutdown` turns true; then stops
/// accepting, lets open connections finish their requests for at most `grace`, closes the rest
/// and returns.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    bounds: HttpBounds,
    grace: Duration,
    shutdown: watch::Receiver<bool>,
    tls: Option<Tls>,
) {
    let mut listener = Listener::new(listener, bounds.max_connections, shutdown.clone());
    while let Some(accepted) = listener.next().await {
        let (stream, peer, slot) = match accepted {
            Accepted::Slot(stream, peer, slot) => (stream, peer, slot),
            Accepted::Full(stream) => {
                // A few bytes into an empty socket buffer: never waits on the client (over TLS
                // the client cannot read them; the connection is closed all the same).
                let _ = stream.try_write(BUSY);
                continue;
            }
        };
        let (app, stop, tls) = (app.clone(), shutdown.clone(), tls.clone());
        listener.spawn(async move {
            match tls {
                None => connection(TokioIo::new(stream), peer, None, app, bounds, stop).await,
                // The handshake is bounded by the header-read timeout, as a request head is.
                Some(tls) => match tls.accept(stream, bounds.header_read_timeout).await {
                    Ok((stream, fingerprint)) => {
                        connection(TokioIo::new(stream), peer, Some(fingerprint), app, bounds, stop).await;
                    }
                    Err(error) => tracing::debug!(%peer, %error, "TLS connection refused"),
                },
            }
            drop(slot);
        });
    }
    listener.drain(grace, "HTTP").await;
}

/// Serves one connection's requests until it closes, or gracefully once `stop` turns true.
async fn connection<I>(
    io: TokioIo<I>,
    peer: SocketAddr,
    fingerprint: Option<TlsFingerprint>,
    app: Router,
    bounds: HttpBounds,
    mut stop: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |mut request: http::Request<Incoming>| {
        request.extensions_mut().insert(ConnectInfo::<SocketAddr>(peer));
        if let Some(fingerprint) = &fingerprint {
            request.extensions_mut().insert(fingerprint.clone());
        }
        let mut app = app.clone();
        async move {
            let response = match tokio::time::timeout(bounds.request_timeout, app.call(request)).await {
                Ok(Ok(response)) => response,
                Ok(Err(never)) => match never {},
                Err(_) => too_slow(bounds.request_timeout),
            };
            Ok::<Response, Infallible>(response)
        }
    });
    let connection = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(bounds.header_read_timeout)
        .max_buf_size(bounds.max_header_bytes.max(8192))
        .serve_connection(io, service);
    tokio::pin!(connection);
    tokio::select! {
        result = connection.as_mut() => {
            if let Err(error) = result {
                tracing::debug!(%peer, %error, "HTTP connection closed");
            }
        }
        () = async { let _ = stop.wait_for(|&stop| stop).await; } => {
            connection.as_mut().graceful_shutdown();
            let _ = connection.await;
        }
    }
}

/// 408 for a request that took longer than the request timeout.
fn too_slow(timeout: Duration) -> Response {
    let body = serde_json::json!({ "error": format!("the request took longer than {} ms", timeout.as_millis()) });
    let mut response = (StatusCode::REQUEST_TIMEOUT, axum::Json(body)).into_response();
    response.headers_mut().insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
    response
}
