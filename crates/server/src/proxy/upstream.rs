//! Forwarding a request the rules admitted, as [`inbound`](super::inbound) shaped it, to the
//! upstream (or a `route` rule's quarantine).
//!
//! **Connections.** An upstream connection belongs to one client connection ([`Dedicated`]):
//! opened for its first request, reused by its later ones, closed with it. So one client's
//! bytes never share an upstream connection with another client's requests: an upstream that
//! misframes a request (reads a body as another request, CL.0) can answer it only to the client
//! that sent it, never to the next one (HAProxy's `http-reuse never`, stricter than `safe`). A
//! body on GET, HEAD, DELETE or TRACE that `--allow-body-on` lets through goes on a connection
//! of its own, closed after its answer.
//!
//! **Framing.** Each way, the body is framed by the proxy: the upstream gets the
//! `Content-Length` that `inbound` set (and the rules read), never the client's spelling; the
//! client gets the framing hyper writes for the upstream's body, never the upstream's
//! `Transfer-Encoding` or a `Content-Length` beside it.
//!
//! **Encoding.** A request whose response a rule reads for its cost (LLM tokens, see
//! `tollgate_tower::usage`) asks the upstream for it unencoded (`Accept-Encoding: identity`).
//!
//! **Time.** The upstream must accept the connection, take each piece of the body, and answer
//! once the body is sent, within `--upstream-timeout` each (then 504), and pause its body no
//! longer than that between two pieces; the client's body must arrive within the request timeout (then 408, see `inbound`).
//! A 502 or 504 says nothing of the upstream's address or error (those go to the log).

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, HttpBody};
use axum::extract::{Request, State};
use axum::response::Response;
use http::{HeaderValue, StatusCode, Uri, Version, header};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tollgate_edge as edge;
use tollgate_tower::Quarantine;
use tollgate_tower::usage::{
    MAX_JSON_BYTES, ReadsResponse, UsageAsked, ask_for_stream_usage, takes_stream_usage_option,
};

use crate::http::held::WriteTimeout;
use crate::proxy::body::{Side, Timed, Watched, too_slow};
use crate::proxy::inbound::{bodiless, client_error, may_be_json, refuse, strip_hop_by_hop};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Where a base URL points: `http://host[:port][/prefix]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    host: String,
    port: u16,
    /// Put before every forwarded path (no trailing `/`).
    prefix: String,
}

impl Target {
    /// `url`, an `http://` URL without a query.
    pub(crate) fn parse(url: &str) -> Result<Target, String> {
        // A user or password is never quoted back (errors reach the log and stderr).
        if url.contains('@') {
            return Err("an upstream URL carries no user or password: give http://host[:port][/prefix]".into());
        }
        let uri: Uri = url.parse().map_err(|e| format!("{url:?} is not a URL: {e}"))?;
        if uri.scheme_str() != Some("http") {
            return Err(format!("{url:?} is not an http:// URL"));
        }
        let Some(authority) = uri.authority() else { return Err(format!("{url:?} names no host")) };
        if uri.query().is_some() {
            return Err(format!("{url:?}: give the upstream as http://host[:port][/prefix]"));
        }
        let host = authority.host().trim_start_matches('[').trim_end_matches(']').to_string();
        let prefix = uri.path().trim_end_matches('/').to_string();
        Ok(Target { host, port: authority.port_u16().unwrap_or(80), prefix })
    }
}

/// The upstream connections of one client connection, one per upstream it reached (the
/// upstream, and each quarantine its requests were routed to).
#[derive(Clone, Default)]
pub(crate) struct Dedicated(Arc<tokio::sync::Mutex<Connections>>);

/// Open upstream connections, by where they go.
type Connections = Vec<(Target, SendRequest<Body>)>;

/// What forwarding needs.
pub(crate) struct Upstream {
    pub(crate) base: Target,
    /// `--upstream-timeout`.
    pub(crate) timeout: Duration,
}

fn gateway_error(status: StatusCode) -> Response {
    let detail = if status == StatusCode::GATEWAY_TIMEOUT {
        "the upstream service did not answer in time"
    } else {
        "the upstream service could not be reached"
    };
    edge::http::problem(status, detail).map(Body::from)
}

/// The handler: forwards the request, answers the upstream's response.
pub(crate) async fn forward(State(upstream): State<Arc<Upstream>>, mut request: Request) -> Response {
    // A request a `route` rule mitigates goes to the rule's quarantine instead.
    let target = match request.extensions_mut().remove::<Quarantine>() {
        None => Cow::Borrowed(&upstream.base),
        Some(quarantine) => match Target::parse(&quarantine.upstream) {
            Ok(target) => Cow::Owned(target),
            Err(error) => {
                tracing::warn!(rule = %quarantine.rule, %error, "cannot forward to the quarantine");
                return gateway_error(StatusCode::BAD_GATEWAY);
            }
        },
    };
    let path = request.uri().path_and_query().map_or("/", |p| p.as_str());
    let Ok(uri) = format!("{}{path}", target.prefix).parse::<Uri>() else {
        return refuse(StatusCode::BAD_REQUEST, "the request target cannot be forwarded");
    };
    *request.uri_mut() = uri;
    *request.version_mut() = Version::HTTP_11;
    let (mut parts, mut body) = request.into_parts();
    let mut usage_asked = false;
    if let Some(reads) = parts.extensions.remove::<ReadsResponse>() {
        // Its response is read for what it cost (LLM tokens), which an encoded body hides: the
        // upstream's compression is given up on such requests.
        parts.headers.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("identity"));
        if reads.usage && takes_stream_usage_option(parts.uri.path()) {
            (body, usage_asked) = match ask_for_usage(&mut parts.headers, body).await {
                Ok(asked) => asked,
                Err(error) => return client_error(&error),
            };
        }
    }
    // A body on a method that carries none (`--allow-body-on`): its own upstream connection.
    let own_connection = body.size_hint().exact() != Some(0) && bodiless(&parts.method).is_some();
    let dedicated = parts.extensions.remove::<Dedicated>().filter(|_| !own_connection);
    let (body, sent) = Watched::new(body);
    let request = Request::from_parts(parts, Body::new(body));
    let exchange = send(dedicated, &target, request, upstream.timeout);
    // The upstream's time to answer counts from the moment the body is sent.
    let answer_in_time = async {
        let _ = sent.await;
        tokio::time::sleep(upstream.timeout).await;
    };
    let outcome = tokio::select! {
        outcome = exchange => outcome,
        () = answer_in_time => Err(Failure::Timeout),
    };
    match outcome {
        Ok(response) => {
            let (mut parts, body) = response.into_parts();
            if usage_asked {
                // The usage-only chunk the client did not ask for is taken out (see `usage`).
                parts.extensions.insert(UsageAsked);
            }
            let _ = strip_hop_by_hop(&mut parts.headers, |_| false);
            // hyper read the upstream's framing and writes its own: the upstream's chunked coding
            // goes, and a length beside it is stale (RFC 9112 section 6.3: a proxy removes it;
            // given both, hyper refused the response and closed the connection without a word).
            if parts.headers.remove(header::TRANSFER_ENCODING).is_some() {
                parts.headers.remove(header::CONTENT_LENGTH);
            }
            Response::from_parts(parts, Body::new(Timed::idle(body, upstream.timeout, Side::Upstream)))
        }
        Err(Failure::Timeout) => {
            tracing::warn!(upstream = ?*target, timeout = ?upstream.timeout, "upstream timed out");
            gateway_error(StatusCode::GATEWAY_TIMEOUT)
        }
        Err(Failure::Error(error)) => {
            if too_slow(&*error).is_some_and(|slow| slow.side == Side::Client) {
                return client_error(&*error);
            }
            if stalled(&*error) {
                tracing::warn!(upstream = ?*target, timeout = ?upstream.timeout, "upstream took no body in time");
                return gateway_error(StatusCode::GATEWAY_TIMEOUT);
            }
            tracing::warn!(upstream = ?*target, %error, "upstream failed");
            gateway_error(StatusCode::BAD_GATEWAY)
        }
    }
}

/// A JSON body (within [`MAX_JSON_BYTES`]) that streams without asking for its usage, asked for
/// it (`stream_options.include_usage`, see `ask_for_stream_usage`), its `Content-Length` set
/// anew; with whether it was. The rules read the client's body: only that field is added after
/// them, so that a streamed completion's usage is known (OpenAI sends it only when asked).
async fn ask_for_usage(headers: &mut http::HeaderMap, body: Body) -> Result<(Body, bool), axum::Error> {
    let length = body.size_hint().exact().unwrap_or(0);
    if length == 0 || length > MAX_JSON_BYTES as u64 || !may_be_json(headers) {
        return Ok((body, false));
    }
    let bytes = http_body_util::BodyExt::collect(body).await?.to_bytes();
    match ask_for_stream_usage(&bytes) {
        Some(asked) => {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(asked.len()));
            Ok((Body::from(asked), true))
        }
        None => Ok((Body::from(bytes), false)),
    }
}

/// Whether `error` is a write to the upstream that waited longer than the upstream timeout
/// (its connection's [`WriteTimeout`]).
fn stalled(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(error) = cause {
        if error.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut) {
            return true;
        }
        cause = error.source();
    }
    false
}

/// Why an exchange with the upstream failed.
enum Failure {
    /// It did not accept the connection, or answer, in time.
    Timeout,
    Error(BoxError),
}

impl Failure {
    fn error(error: impl Into<BoxError>) -> Self {
        Failure::Error(error.into())
    }
}

/// Sends `request` on the client connection's upstream connection to `target` (opened if it has
/// none, or the one it had was closed), or on a connection of its own without `dedicated`.
async fn send(
    dedicated: Option<Dedicated>,
    target: &Target,
    mut request: Request,
    timeout: Duration,
) -> Result<hyper::Response<Incoming>, Failure> {
    let Some(dedicated) = dedicated else {
        let mut sender = connect(target, timeout).await?;
        return sender.send_request(request).await.map_err(Failure::error);
    };
    let mut connections = dedicated.0.lock().await;
    if let Some(at) = connections.iter().position(|(reached, _)| reached == target) {
        let sender = &mut connections[at].1;
        // Ready at once unless the upstream closed it (its last exchange is over).
        if matches!(tokio::time::timeout(timeout, sender.ready()).await, Ok(Ok(()))) {
            match sender.try_send_request(request).await {
                Ok(response) => return Ok(response),
                Err(mut error) => match error.take_message() {
                    // Never written: the upstream had closed the connection; another one.
                    Some(unsent) => request = unsent,
                    None => {
                        connections.swap_remove(at);
                        return Err(Failure::error(error.into_error()));
                    }
                },
            }
        }
        connections.swap_remove(at);
    }
    let mut sender = connect(target, timeout).await?;
    let response = sender.send_request(request).await.map_err(Failure::error)?;
    connections.push((target.clone(), sender));
    Ok(response)
}

/// A new HTTP/1.1 connection to `target`, accepted within `timeout`, whose writes may wait at
/// most `timeout` too (an upstream that takes no more of a body fails the exchange).
async fn connect(target: &Target, timeout: Duration) -> Result<SendRequest<Body>, Failure> {
    let connecting = TcpStream::connect((target.host.as_str(), target.port));
    let stream =
        tokio::time::timeout(timeout, connecting).await.map_err(|_| Failure::Timeout)?.map_err(Failure::error)?;
    let _ = stream.set_nodelay(true);
    let stream = TokioIo::new(WriteTimeout::new(stream, timeout));
    let (sender, connection) =
        hyper::client::conn::http1::Builder::new().handshake(stream).await.map_err(Failure::error)?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!(%error, "upstream connection closed");
        }
    });
    Ok(sender)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_upstream_urls() {
        let target = Target::parse("http://[::1]:3000/app/").unwrap();
        assert_eq!((target.host.as_str(), target.port, target.prefix.as_str()), ("::1", 3000, "/app"));
        assert_eq!(Target::parse("http://backend").unwrap().port, 80);
        assert!(Target::parse("https://backend").is_err());
        assert!(Target::parse("http://backend/?x=1").is_err());
    }
}
