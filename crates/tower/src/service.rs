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
use smallvec::SmallVec;
use tollgate_edge::http as edge;
use tollgate_engine::{Admission, Answer, Engine, Policy, Proceed, Unsettled};
use tollgate_rules::ResponseCost;
use tollgate_store::Store;
use tower_service::Service;

use crate::future::{self, ResponseFuture};
use crate::options::Options;
use crate::shadow::{self, Ban, Fake, Learning, Shadow};
use crate::usage::{Metered, ReadsResponse, RequestValues};

/// The peer address, for servers other than axum (which provides `ConnectInfo<SocketAddr>`):
/// insert it as a request extension.
#[derive(Debug, Clone, Copy)]
pub struct PeerAddr(pub SocketAddr);

/// The TLS fingerprints of the connection a request came on, for the `ja3` and `ja4`
/// characteristics: a TLS listener inserts it as a request extension (`tollgate proxy` does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFingerprint {
    /// JA3: the MD5 of the ClientHello's version, ciphers, extensions, groups and point formats.
    pub ja3: Arc<str>,
    /// JA4 (FoxIO): `t13d1516h2_…`.
    pub ja4: Arc<str>,
}

/// Where a request a `route` rule mitigates must go instead of the usual upstream (with
/// [`Options::routes`](crate::Options::routes)): the extension the inner service receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quarantine {
    /// The quarantine upstream's base URL (`http://…`).
    pub upstream: String,
    /// The rule that sent it there.
    pub rule: String,
}

/// Applies the engine's rules to every request before (and after) the inner service.
pub struct RateLimit<I, S> {
    pub(crate) inner: I,
    pub(crate) shared: Arc<Shared<S>>,
}

/// What every clone of a layer's services shares, behind one reference count: axum clones a
/// route's service for each request.
pub(crate) struct Shared<S> {
    pub(crate) engine: Arc<Engine<S>>,
    pub(crate) options: Options,
    pub(crate) shadow: Arc<Shadow>,
}

impl<I: Clone, S> Clone for RateLimit<I, S> {
    fn clone(&self) -> Self {
        RateLimit { inner: self.inner.clone(), shared: self.shared.clone() }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What the rules may read of a request, borrowed from it (or from its `Parts`, when the body
/// has to be set aside while the store is waited for: it need not be `Sync`).
#[derive(Clone, Copy)]
struct Head<'r> {
    method: &'r http::Method,
    uri: &'r http::Uri,
    headers: &'r http::HeaderMap,
    extensions: &'r http::Extensions,
}

impl<'r> Head<'r> {
    fn of<B>(request: &'r Request<B>) -> Self {
        Head {
            method: request.method(),
            uri: request.uri(),
            headers: request.headers(),
            extensions: request.extensions(),
        }
    }

    fn of_parts(parts: &'r Parts) -> Self {
        Head { method: &parts.method, uri: &parts.uri, headers: &parts.headers, extensions: &parts.extensions }
    }

    fn peer(self) -> Option<IpAddr> {
        self.extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|c| c.0.ip())
            .or_else(|| self.extensions.get::<PeerAddr>().map(|p| p.0.ip()))
    }

    /// The host the application will act on, canonical (see `tollgate_rules::canonical`): the
    /// absolute-form target's authority, else the `Host` header. Refused when `Host` is given
    /// twice with different values or is not text: which one the application reads is a guess.
    fn host(self) -> Result<&'r str, Refusal> {
        if let Some(host) = self.uri.host() {
            return Ok(tollgate_rules::canonical::host(host));
        }
        let mut lines = self.headers.get_all(http::header::HOST).iter();
        let Some(first) = lines.next() else { return Ok("") };
        if lines.any(|other| other != first) {
            return Err(Refusal::Host("the request has two different Host headers"));
        }
        let host = std::str::from_utf8(first.as_bytes()).map_err(|_| Refusal::Host("the Host header is not text"))?;
        Ok(tollgate_rules::canonical::host(host))
    }
}

/// The values of the headers the rules name, borrowed from the request (as bytes: a value that
/// is not text is read as it is, never dropped).
type HeaderValues<'r> = SmallVec<[(&'r str, &'r [u8]); 4]>;

/// A request the rules cannot be applied to.
enum Refusal {
    /// A rule keys on the client address and the server gives none: answered 500 (never a guess).
    NoPeer,
    /// A rule matches on the host and the request's is ambiguous: answered 400.
    Host(&'static str),
}

impl Refusal {
    fn response(self) -> Response<Body> {
        match self {
            Refusal::NoPeer => {
                edge::problem(http::StatusCode::INTERNAL_SERVER_ERROR, "the rate limiter has no client address")
            }
            Refusal::Host(why) => edge::problem(http::StatusCode::BAD_REQUEST, why),
        }
        .map(Body::from)
    }
}

/// What the rules read of the request's connection and head besides its headers.
#[derive(Clone, Copy)]
struct Seen<'r> {
    client_ip: IpAddr,
    /// Whether the peer is a trusted proxy.
    trusted: bool,
    host: &'r str,
}

impl<'r> Head<'r> {
    /// The client's address (the peer's, or through trusted proxies only), and the host if a
    /// rule reads it.
    fn seen(self, policy: &Policy) -> Result<Seen<'r>, Refusal> {
        let host = if policy.uses_host { self.host()? } else { "" };
        let (client_ip, trusted) = self.client_ip(policy)?;
        Ok(Seen { client_ip, trusted, host })
    }

    /// The client's address: the peer's, or through trusted proxies only; and whether the peer
    /// is a trusted proxy.
    fn client_ip(self, policy: &Policy) -> Result<(IpAddr, bool), Refusal> {
        match self.peer() {
            // The forwarding header counts only from a trusted proxy: not read otherwise.
            Some(peer) if policy.rules.trusted_proxies.trusts(peer) => {
                let forwarded = policy.rules.trusted_proxies.header().as_str();
                let values: SmallVec<[&[u8]; 4]> =
                    self.headers.get_all(forwarded).iter().map(http::HeaderValue::as_bytes).collect();
                Ok((policy.rules.trusted_proxies.client_ip(peer, &values), true))
            }
            Some(peer) => Ok((peer, false)),
            None if policy.uses_client_ip => {
                tracing::error!(
                    "RateLimitLayer has no peer address for a rule keyed on client_ip: serve the app with \
                     into_make_service_with_connect_info::<SocketAddr>() (or insert a PeerAddr extension)"
                );
                Err(Refusal::NoPeer)
            }
            None => Ok((IpAddr::from([0, 0, 0, 0]), false)),
        }
    }

    /// The client's TLS fingerprints: a trusted proxy's headers when the rules name them (the
    /// proxy's own connection says nothing of the client), otherwise the connection's. Of several
    /// values (header lines, or a comma-separated list) the last is the proxy's: one that appends
    /// rather than replaces leaves the client's own before it.
    fn fingerprints(self, policy: &Policy, from_trusted_proxy: bool) -> (Option<&'r str>, Option<&'r str>) {
        if !policy.uses_fingerprints {
            return (None, None);
        }
        let own = self.extensions.get::<TlsFingerprint>();
        let headers = &policy.rules.fingerprint_headers;
        let pick = |header: &Option<String>, own: Option<&'r str>| match header {
            Some(name) if from_trusted_proxy => {
                let last = self.headers.get_all(name.as_str()).iter().next_back()?.to_str().ok()?;
                last.rsplit(',').next().map(str::trim).filter(|v| !v.is_empty())
            }
            _ => own,
        };
        (pick(&headers.ja3, own.map(|f| &*f.ja3)), pick(&headers.ja4, own.map(|f| &*f.ja4)))
    }

    /// Collects the values of the headers the rules read into `values` (kept by the caller: the
    /// request's view borrows them).
    fn header_values(self, policy: &'r Policy, values: &mut HeaderValues<'r>) {
        for name in &policy.header_names {
            for value in self.headers.get_all(name.as_str()) {
                values.push((name.as_str(), value.as_bytes()));
            }
        }
        // What the front end read of the body for the rules' estimates, as pseudo-headers.
        if let Some(read) = self.extensions.get::<RequestValues>() {
            values.extend(read.pairs());
        }
    }

    /// The request as the engine sees it.
    fn view<'v>(
        self,
        seen: Seen<'r>,
        headers: &'v [(&'r str, &'r [u8])],
        policy: &Policy,
    ) -> tollgate_engine::Request<'v>
    where
        'r: 'v,
    {
        let Seen { client_ip, trusted, host } = seen;
        let (ja3, ja4) = self.fingerprints(policy, trusted);
        tollgate_engine::Request {
            ja3,
            ja4,
            method: self.method.as_str(),
            path: self.uri.path(),
            query: self.uri.query().unwrap_or(""),
            host,
            headers,
            client_ip,
            key: None,
            from_trusted_proxy: trusted,
        }
    }
}

/// The response to `answer` (a shadow-ban's is [`Shadow::fake`]'s), written by the engine's HTTP
/// edge.
fn render(answer: Answer, options: Options) -> Response<Body> {
    match answer {
        // Not routed (see `routed`): the request is rejected, never served.
        Answer::TooMany(fields) | Answer::Route { fields, .. } => edge::too_many_requests(
            &fields.policy,
            &fields.limit,
            &fields.decision,
            fields.rate_per_s,
            options.legacy_headers,
        ),
        Answer::ShadowBan { status, body, content_type, .. } => edge::shadow(status, &body, &content_type),
        Answer::BadRequest(message) => edge::problem(http::StatusCode::BAD_REQUEST, &message),
        Answer::Unavailable(message) => edge::problem(http::StatusCode::SERVICE_UNAVAILABLE, &message),
    }
    .map(Body::from)
}

/// What becomes of a request the engine answered.
enum Answered<B> {
    /// Passed on, marked for its quarantine.
    Quarantined(Request<B>),
    /// Answered with this (a shadow-ban's fake perhaps after a wait).
    Response(Fake),
}

/// The request, marked for its quarantine, if `answer` routes it there (the engine does so only
/// when built to route, see [`Options::routes`]); otherwise the answer's response: for a
/// shadow-ban, a fake shaped like the route's real responses (see [`crate::shadow`]).
fn answered<B>(
    answer: Answer,
    request: Request<B>,
    options: Options,
    shadow: &Arc<Shadow>,
    policy: &Policy,
) -> Answered<B> {
    match answer {
        Answer::Route { upstream, fields } => {
            let mut request = request;
            request.extensions_mut().insert(Quarantine { upstream, rule: fields.policy });
            Answered::Quarantined(request)
        }
        Answer::ShadowBan { status, body, content_type, fields } => {
            let ban = Ban { status, body, content_type, fields };
            Answered::Response(shadow.fake(policy, ban, &request, options))
        }
        answer => Answered::Response(Fake { response: render(answer, options), wait: None }),
    }
}

/// Waits for a request's slot, calls `inner`, and settles the request's `count_status`
/// reservations, if any, with the response's status; those of rules whose cost is read from the
/// response, as its body is read ([`Metered`]). Dropped while `inner` answers (the client left, the server's timeout), the
/// call goes on and its status settles them all the same (see [`future::Answering`]); dropped
/// before the call (waiting for its slot), or with a panic of `inner` unwinding, they are settled
/// with no status: refunded (see [`Unsettled`]).
async fn proceed<I, S, B, RB>(
    engine: Arc<Engine<S>>,
    policy: Arc<Policy>,
    mut proceed: Proceed,
    mut inner: I,
    mut request: Request<B>,
    options: Options,
    mut learning: Option<Box<Learning>>,
) -> Result<Response<Body>, I::Error>
where
    I: Service<Request<B>, Response = Response<RB>>,
    I::Future: Send + 'static,
    RB: http_body::Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
    S: Store + 'static,
{
    let pending = std::mem::take(&mut proceed.pending);
    let unsettled = (!pending.is_empty()).then(|| engine.unsettled(pending));
    let costs = unsettled.as_ref().map(Unsettled::response_costs).unwrap_or_default();
    if !costs.is_empty() {
        // Its response is read for its cost: a front end asks for it unencoded (and a stream
        // for its usage).
        let usage = costs.iter().any(|cost| matches!(cost, ResponseCost::Usage(_)));
        request.extensions_mut().insert(ReadsResponse { usage });
    }
    proceed.wait().await;
    let fields = if options.headers_on_allowed { proceed.fields(&policy) } else { None };
    if let Some(learning) = &mut learning {
        learning.start();
    }
    let response = match unsettled {
        // Nothing to settle: the call ends with its client, as without the layer.
        None => inner.call(request).await?,
        Some(unsettled) => {
            let (response, unsettled) = future::Answering::new(inner.call(request), unsettled).await?;
            let costs = unsettled.response_costs();
            if !costs.is_empty() {
                // Settled as the body is read (see `usage`).
                let response = Metered::wrap(response, unsettled, costs);
                return Ok(future::finish(response, fields.as_ref(), options, learning.as_deref()));
            }
            unsettled.complete(response.status().as_u16()).await;
            response
        }
    };
    Ok(future::finish(response, fields.as_ref(), options, learning.as_deref()))
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
    type Future = ResponseFuture<I::Future, I::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let Shared { engine, options, shadow } = &*self.shared;
        let options = *options;
        // When the request's time runs out, if the server gives it one.
        let deadline = options.request_timeout.map(|timeout| (tokio::time::Instant::now(), timeout));
        let policy = engine.current();
        // Decided here when the store decides in place; `None` when it must be waited for.
        let head = Head::of(&request);
        let (admission, learning) = match head.seen(&policy) {
            Ok(seen) => {
                let mut headers = HeaderValues::new();
                head.header_values(&policy, &mut headers);
                let within = deadline.map(|(_, timeout)| timeout);
                let view = head.view(seen, &headers, &policy);
                let admission = engine.admit_now(&policy, &view, within);
                let learning = match &admission {
                    Some(Admission::Proceed(_)) => {
                        shadow.learning(&policy, &view, || shadow::host_of(head.uri, head.headers))
                    }
                    _ => None,
                };
                (admission, learning)
            }
            Err(refusal) => return ResponseFuture::answered(refusal.response()),
        };
        match admission {
            Some(Admission::Answer(answer)) => match answered(answer, request, options, shadow, &policy) {
                Answered::Quarantined(request) => ResponseFuture::passed(self.inner.call(request), None, options, None),
                Answered::Response(Fake { response, wait: None }) => ResponseFuture::answered(response),
                Answered::Response(Fake { response, wait: Some(wait) }) => {
                    ResponseFuture::waiting(Box::pin(async move {
                        wait.elapse().await;
                        Ok(response)
                    }))
                }
            },
            Some(Admission::Proceed(admitted)) if admitted.delay.is_zero() && admitted.pending.is_empty() => {
                let fields = if options.headers_on_allowed { admitted.fields(&policy).map(Box::new) } else { None };
                ResponseFuture::passed(self.inner.call(request), fields, options, learning)
            }
            admission => {
                // The inner service was made ready; keep it and leave a fresh clone (tower's usual
                // swap), as it is called later, from the task.
                let clone = self.inner.clone();
                let mut inner = std::mem::replace(&mut self.inner, clone);
                let (engine, policy, shadow) = (engine.clone(), Arc::clone(&policy), shadow.clone());
                ResponseFuture::waiting(Box::pin(async move {
                    let (admitted, request, learning) = match admission {
                        Some(Admission::Proceed(admitted)) => (admitted, request, learning),
                        _ => {
                            // The head is borrowed across the store's wait, the body set aside.
                            let (parts, body) = request.into_parts();
                            let head = Head::of_parts(&parts);
                            let seen = match head.seen(&policy) {
                                Ok(seen) => seen,
                                Err(refusal) => return Ok(refusal.response()),
                            };
                            let mut headers = HeaderValues::new();
                            head.header_values(&policy, &mut headers);
                            let within = deadline.map(|(at, timeout)| timeout.saturating_sub(at.elapsed()));
                            let view = head.view(seen, &headers, &policy);
                            let admission = engine.admit_within(&policy, &view, within).await;
                            let learning = match &admission {
                                Admission::Proceed(_) => {
                                    shadow.learning(&policy, &view, || shadow::host_of(head.uri, head.headers))
                                }
                                Admission::Answer(_) => None,
                            };
                            drop(headers);
                            match admission {
                                Admission::Answer(answer) => {
                                    let request = Request::from_parts(parts, body);
                                    return match answered(answer, request, options, &shadow, &policy) {
                                        Answered::Quarantined(request) => {
                                            inner.call(request).await.map(|r| future::finish(r, None, options, None))
                                        }
                                        Answered::Response(Fake { response, wait }) => {
                                            if let Some(wait) = wait {
                                                wait.elapse().await;
                                            }
                                            Ok(response)
                                        }
                                    };
                                }
                                Admission::Proceed(admitted) => (admitted, Request::from_parts(parts, body), learning),
                            }
                        }
                    };
                    proceed(engine, policy, admitted, inner, request, options, learning).await
                }))
            }
        }
    }
}
