//! [`RateLimit`]: the service. It never waits in `poll_ready` (readiness is the inner service's);
//! a request over its limit is answered at once, like tower's `LoadShed` rather than its
//! `RateLimit`, except for `delay` rules, which wait for the request's slot inside the call.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::ConnectInfo;
use axum_core::body::Body;
use bytes::Bytes;
use http::{Request, Response};
use tollgate_store::Store;
use tower_service::Service;

use crate::future::ResponseFuture;
use crate::guard::{Guard, Owned, Verdict};
use crate::response;

/// The peer address, for servers other than axum (which provides `ConnectInfo<SocketAddr>`):
/// insert it as a request extension.
#[derive(Debug, Clone, Copy)]
pub struct PeerAddr(pub SocketAddr);

/// Applies rules to every request before (and after) the inner service.
pub struct RateLimit<I, S> {
    pub(crate) inner: I,
    pub(crate) guard: Arc<Guard<S>>,
}

impl<I: Clone, S> Clone for RateLimit<I, S> {
    fn clone(&self) -> Self {
        RateLimit { inner: self.inner.clone(), guard: self.guard.clone() }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn owned<B>(
    request: &Request<B>,
    wanted: &[String],
    uses_host: bool,
    guard_client: impl Fn(IpAddr, &[&str], &[&str]) -> IpAddr,
) -> Owned {
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip())
        .or_else(|| request.extensions().get::<PeerAddr>().map(|p| p.0.ip()))
        .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    let values =
        |name: &str| -> Vec<&str> { request.headers().get_all(name).iter().filter_map(|v| v.to_str().ok()).collect() };
    let client_ip = guard_client(peer, &values("x-forwarded-for"), &values("forwarded"));
    let host = if !uses_host {
        String::new()
    } else {
        request
            .uri()
            .host()
            .map(str::to_string)
            .or_else(|| {
                request
                    .headers()
                    .get(http::header::HOST)
                    .and_then(|h| h.to_str().ok())
                    .map(|h| h.split(':').next().unwrap_or(h).to_string())
            })
            .unwrap_or_default()
    };
    Owned {
        method: request.method().clone(),
        uri: request.uri().clone(),
        host,
        headers: request
            .headers()
            .iter()
            .filter(|(n, _)| wanted.iter().any(|w| w == n.as_str()))
            .filter_map(|(n, v)| v.to_str().ok().map(|v| (n.as_str().to_string(), v.to_string())))
            .collect(),
        client_ip,
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
        let guard = self.guard.clone();
        // The inner service was made ready; keep it and leave a fresh clone (tower's usual swap).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let view = owned(&request, &guard.header_names, guard.uses_host, |peer, xff, fwd| {
            guard.rules.trusted_proxies.client_ip(peer, xff, fwd)
        });
        ResponseFuture {
            inner: Box::pin(async move {
                match guard.admit(&view).await {
                    Verdict::Respond(response) => Ok(response),
                    Verdict::Proceed { delay_ns, fields, after } => {
                        if delay_ns > 0 {
                            tokio::time::sleep(std::time::Duration::from_nanos(delay_ns)).await;
                        }
                        let response = inner.call(request).await?;
                        guard.after(after, response.status().as_u16()).await;
                        let mut response = response.map(Body::new);
                        if guard.options.headers_on_allowed
                            && let Some((name, limit, decision)) = fields
                        {
                            let legacy = guard.options.legacy_headers;
                            response::rate_limit_fields(response.headers_mut(), &name, &limit, &decision, legacy);
                        }
                        Ok(response)
                    }
                }
            }),
        }
    }
}
