//! [`RateLimit`]: the service. It never waits in `poll_ready` (readiness is the inner service's);
//! a request over its limit is answered at once, like tower's `LoadShed` rather than its
//! `RateLimit`, except for `delay` rules, which wait for the request's slot inside the call.
//!
//! The request's characteristics are read in place (the view borrows the request inside the
//! response future): only the headers the rules read are looked at, nothing is copied.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::ConnectInfo;
use axum_core::body::Body;
use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};
use tollgate_engine::{Admission, Answer, Engine, Policy};
use tollgate_store::Store;
use tower_service::Service;

use crate::future::ResponseFuture;
use crate::layer::Options;
use crate::response;

/// The peer address, for servers other than axum (which provides `ConnectInfo<SocketAddr>`):
/// insert it as a request extension.
#[derive(Debug, Clone, Copy)]
pub struct PeerAddr(pub SocketAddr);

/// Applies the engine's rules to every request before (and after) the inner service.
pub struct RateLimit<I, S> {
    pub(crate) inner: I,
    pub(crate) engine: Arc<Engine<S>>,
    pub(crate) options: Options,
}

impl<I: Clone, S> Clone for RateLimit<I, S> {
    fn clone(&self) -> Self {
        RateLimit { inner: self.inner.clone(), engine: self.engine.clone(), options: self.options }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn peer(request: &Parts) -> Option<IpAddr> {
    let extensions = &request.extensions;
    extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip())
        .or_else(|| extensions.get::<PeerAddr>().map(|p| p.0.ip()))
}

/// The request's host, without port.
fn host(request: &Parts) -> &str {
    request
        .uri
        .host()
        .or_else(|| {
            let host = request.headers.get(http::header::HOST)?.to_str().ok()?;
            Some(host.split(':').next().unwrap_or(host))
        })
        .unwrap_or("")
}

/// The values of the headers the rules read, as `(name, value)` pairs borrowed from the request.
fn headers<'r>(request: &'r Parts, policy: &'r Policy) -> Vec<(&'r str, &'r str)> {
    let mut pairs = Vec::new();
    for name in &policy.header_names {
        for value in request.headers.get_all(name.as_str()) {
            if let Ok(value) = value.to_str() {
                pairs.push((name.as_str(), value));
            }
        }
    }
    pairs
}

/// Admits the request (its head: the body is not needed, nor `Sync`) through `engine`: the
/// answer to give instead, or what to settle later.
async fn admit<S: Store>(engine: &Engine<S>, request: &Parts) -> Result<Admission, Response<Body>> {
    let policy = engine.policy();
    let client_ip = match peer(request) {
        Some(peer) => {
            let forwarded = policy.rules.trusted_proxies.header().name();
            let values: Vec<&str> = request.headers.get_all(forwarded).iter().filter_map(|v| v.to_str().ok()).collect();
            policy.rules.trusted_proxies.client_ip(peer, &values)
        }
        None if policy.uses_client_ip => {
            tracing::error!(
                "RateLimitLayer has no peer address for a rule keyed on client_ip: serve the app with \
                 into_make_service_with_connect_info::<SocketAddr>() (or insert a PeerAddr extension)"
            );
            return Err(response::problem(
                http::StatusCode::INTERNAL_SERVER_ERROR,
                "the rate limiter has no client address",
            ));
        }
        None => IpAddr::from([0, 0, 0, 0]),
    };
    let headers = headers(request, &policy);
    let view = tollgate_engine::Request {
        method: request.method.as_str(),
        path: request.uri.path(),
        query: request.uri.query().unwrap_or(""),
        host: if policy.uses_host { host(request) } else { "" },
        headers: &headers,
        client_ip,
        key: None,
    };
    Ok(engine.admit(&view).await)
}

fn render(answer: Answer, options: Options) -> Response<Body> {
    match answer {
        Answer::TooMany(fields) => {
            response::too_many_requests(&fields.policy, &fields.limit, &fields.decision, options.legacy_headers)
        }
        Answer::ShadowBan { status, body, content_type } => response::shadow(status, &body, &content_type),
        Answer::BadRequest(message) => response::problem(http::StatusCode::BAD_REQUEST, &message),
        Answer::Unavailable(message) => response::problem(http::StatusCode::SERVICE_UNAVAILABLE, &message),
    }
}

impl<I, S, B, RB> Service<Request<B>> for RateLimit<I, S>
where
    I: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    I::Future: Send,
    I::Error: Send + 'static,
    B: Send + 'static,
    RB: http_body::Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
    S: Store + 'static,
{
    type Response = Response<Body>;
    type Error = I::Error;
    type Future = ResponseFuture<I::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let (engine, options) = (self.engine.clone(), self.options);
        // The inner service was made ready; keep it and leave a fresh clone (tower's usual swap).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        ResponseFuture {
            inner: Box::pin(async move {
                let (parts, body) = request.into_parts();
                let proceed = match admit(&engine, &parts).await {
                    Err(response) => return Ok(response),
                    Ok(Admission::Answer(answer)) => return Ok(render(answer, options)),
                    Ok(Admission::Proceed(proceed)) => proceed,
                };
                if !proceed.delay.is_zero() {
                    tokio::time::sleep(proceed.delay).await;
                }
                let response = inner.call(Request::from_parts(parts, body)).await?;
                if !proceed.pending.is_empty() {
                    engine.complete(proceed.pending, response.status().as_u16()).await;
                }
                let mut response = response.map(Body::new);
                if options.headers_on_allowed
                    && let Some(fields) = proceed.fields
                {
                    response::rate_limit_fields(
                        response.headers_mut(),
                        &fields.policy,
                        &fields.limit,
                        &fields.decision,
                        options.legacy_headers,
                    );
                }
                Ok(response)
            }),
        }
    }
}
