//! Serving HTTP/1.1 with bounds, for `tollgate serve` and `tollgate proxy`: a header-read timeout
//! (slowloris; hyper runs it for the first request and while a kept-alive connection waits for
//! the next), a timeout per request (body included: 408), a connection cap (503 and close
//! beyond it), a bound on the request head, a write timeout (a client that accepts no byte of a
//! response for that long is closed), and on shutdown a grace period after which the
//! connections still open are closed, whatever their clients do. The proxy's listener adds
//! [`ListenerOptions`]: a cap per client address, its own request timing, and values made per
//! connection for its requests.
//!
//! hyper's own HTTP/1 connection does the protocol (hyper-util's timer gives it the header-read
//! timeout); the router is an axum `Router`, which also bounds bodies (413). The peer's address is
//! given to the router as axum's `ConnectInfo<SocketAddr>`; over TLS ([`Tls`]), the
//! connection's fingerprints as a `TlsFingerprint` extension too.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
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
use crate::http::held::{ClientCounts, PerClient, WriteTimeout};
use crate::http::tls::Tls;
use crate::listener::{Accepted, Listener};

/// Answered, without reading the request, to a connection beyond the cap.
const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";

/// Answered, without reading the request, to a connection beyond its client's cap.
const TOO_MANY_CONNECTIONS: &[u8] =
    b"HTTP/1.1 429 Too Many Requests\r\ncontent-length: 0\r\nretry-after: 1\r\nconnection: close\r\n\r\n";

/// What a listener applies beyond its [`HttpBounds`] (the proxy's; `serve`'s HTTP listener and
/// the admin listener take the defaults: none of it, but `serve`'s workers).
#[derive(Clone, Default)]
pub struct ListenerOptions {
    /// The cap on one client address's connections (those beyond it: 429 and closed).
    pub per_client: Option<PerClient>,
    /// The app bounds the phases of each request itself (the proxy: the client's body by the
    /// request timeout, the upstream by its own): the request timeout is not applied around it.
    pub app_times_requests: bool,
    /// Values made once per connection, given to each of its requests as extensions.
    pub per_connection: Option<Arc<dyn Fn() -> http::Extensions + Send + Sync>>,
    /// The runtimes connections are handed to in turn (none: served where they are accepted).
    pub workers: crate::workers::Workers,
}

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
    serve_with(listener, app, bounds, grace, shutdown, tls, ListenerOptions::default()).await;
}

/// [`serve`], with `options`.
pub async fn serve_with(
    listener: TcpListener,
    app: Router,
    bounds: HttpBounds,
    grace: Duration,
    shutdown: watch::Receiver<bool>,
    tls: Option<Tls>,
    options: ListenerOptions,
) {
    let mut listener = Listener::new(listener, bounds.max_connections, shutdown.clone()).on(options.workers.clone());
    let counts = Arc::new(ClientCounts::default());
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
        let client_slot = match &options.per_client {
            Some(cap) if !(cap.exempt)(peer.ip()) => match counts.acquire(peer.ip(), cap.max) {
                Some(client_slot) => Some(client_slot),
                None => {
                    tracing::debug!(%peer, max = cap.max, "connection refused: the client holds its cap");
                    let _ = stream.try_write(TOO_MANY_CONNECTIONS);
                    continue;
                }
            },
            _ => None,
        };
        let (app, stop, tls, options) = (app.clone(), shutdown.clone(), tls.clone(), options.clone());
        listener.serve(stream, move |stream| async move {
            let local = options.per_connection.as_ref().map(|make| make());
            let serving =
                Serving { peer, app, bounds, stop, local, whole_request_timeout: !options.app_times_requests };
            match tls {
                None => serving.connection(WriteTimeout::new(stream, bounds.write_timeout), None).await,
                // The handshake is bounded by the header-read timeout, as a request head is.
                Some(tls) => match tls.accept(stream, bounds.header_read_timeout).await {
                    Ok((stream, fingerprint)) => {
                        serving.connection(WriteTimeout::new(stream, bounds.write_timeout), Some(fingerprint)).await;
                    }
                    Err(error) => tracing::debug!(%peer, %error, "TLS connection refused"),
                },
            }
            drop((slot, client_slot));
        });
    }
    listener.drain(grace, "HTTP").await;
}

/// What serving one connection needs.
struct Serving {
    peer: SocketAddr,
    app: Router,
    bounds: HttpBounds,
    stop: watch::Receiver<bool>,
    /// The connection's own extensions, given to each of its requests.
    local: Option<http::Extensions>,
    whole_request_timeout: bool,
}

impl Serving {
    /// Serves the connection's requests until it closes, or gracefully once `stop` turns true.
    async fn connection<I>(self, io: I, fingerprint: Option<TlsFingerprint>)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let Serving { peer, app, bounds, mut stop, local, whole_request_timeout } = self;
        let service = hyper::service::service_fn(move |mut request: http::Request<Incoming>| {
            request.extensions_mut().insert(ConnectInfo::<SocketAddr>(peer));
            if let Some(fingerprint) = &fingerprint {
                request.extensions_mut().insert(fingerprint.clone());
            }
            if let Some(local) = &local {
                request.extensions_mut().extend(local.clone());
            }
            let mut app = app.clone();
            async move {
                if !whole_request_timeout {
                    let Ok(response) = app.call(request).await;
                    return Ok::<Response, Infallible>(response);
                }
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
            .serve_connection(TokioIo::new(io), service);
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
}

/// 408 for a request that took longer than the request timeout.
fn too_slow(timeout: Duration) -> Response {
    let body = serde_json::json!({ "error": format!("the request took longer than {} ms", timeout.as_millis()) });
    let mut response = (StatusCode::REQUEST_TIMEOUT, axum::Json(body)).into_response();
    response.headers_mut().insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
    response
}
