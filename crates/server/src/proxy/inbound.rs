//! What the proxy makes of a request before the rules see it, so that the rules read exactly
//! what the upstream will receive (ARCHITECTURE principle 12: the rules run on the request as
//! rewritten here, and `forward` changes nothing they read).
//!
//! Refused, with `Connection: close` (the request's body is never read):
//! - `CONNECT` (501): the proxy opens no tunnels;
//! - a request target longer than `--http-max-target` (414), as nginx's 8 KiB request line;
//! - a body on GET, HEAD, DELETE or TRACE, whatever the method's case (400), unless
//!   `--allow-body-on` names the method: RFC 9110 gives it no meaning and says it may be
//!   rejected as a smuggling attempt; an upstream that ignores it reads it as another request,
//!   one the rules never rated (CL.0);
//! - no `Host`, or more than one `Host` line (400, RFC 9112 section 3.2);
//! - a `Connection` header naming `Host`, the framing (`Content-Length`, `Transfer-Encoding`),
//!   a forwarding header the proxy owns or any header a rule reads (400): its removal would let
//!   the upstream see another request than the rules did.
//!
//! Rewritten:
//! - an absolute-form target's authority becomes `Host` (RFC 9112 section 3.2.2: it wins);
//! - the hop-by-hop headers and those `Connection` names are removed, and so is any header
//!   whose name, `_` read as `-`, is one the rules read or the proxy owns, spelled otherwise
//!   (`X_Forwarded_For`): CGI, PHP, WSGI and Rack servers read both spellings as one;
//! - the body is framed: the client's `Content-Length` and `Transfer-Encoding` (whatever their
//!   spelling) give way to the `Content-Length` the upstream will receive, which the rules read
//!   (a chunked body is read first for it, up to `--http-max-body`: 413 above);
//! - the forwarding headers are the proxy's ([`OWNED`]): from a peer that is not a trusted proxy
//!   they are removed, `X-Forwarded-For` is set to the peer and `X-Forwarded-Proto` to the
//!   listener's scheme; from a trusted proxy they are kept, every `X-Forwarded-For` line joined
//!   in order with the peer appended (a `Forwarded` chain likewise, `for=PEER`), and
//!   `X-Forwarded-Proto` set only if absent.
//!
//! The client's body must arrive within the request timeout (408), and every 429 closes the
//! connection: a client told to slow down gets no kept-alive connection to retry on at once.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, HttpBody};
use axum::extract::{ConnectInfo, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use tollgate_edge as edge;
use tollgate_engine::{Engine, Policy};
use tollgate_rules::RequestField;
use tollgate_tower::usage::RequestValues;

use crate::backend::Backend;
use crate::proxy::body::{Side, Timed, too_slow};

/// Headers that belong to one hop, not to the request (RFC 9110 section 7.6.1).
const HOP_BY_HOP: [&str; 7] =
    ["connection", "keep-alive", "proxy-connection", "te", "trailer", "upgrade", "proxy-authorization"];

/// The headers that tell an application who the client is, where it came from or what it asked
/// for, as proxies write them: only a trusted proxy's are believed and forwarded.
pub(crate) const OWNED: [&str; 18] = [
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "x-forwarded-port",
    "x-forwarded-prefix",
    "x-forwarded-server",
    "x-forwarded-scheme",
    "x-forwarded-ssl",
    "x-real-ip",
    "true-client-ip",
    "x-client-ip",
    "cf-connecting-ip",
    "fastly-client-ip",
    "x-cluster-client-ip",
    "x-original-host",
    // Symfony, Zend and IIS route on these instead of the target.
    "x-original-url",
    "x-rewrite-url",
];

/// Methods whose requests carry no body by convention (CONNECT is refused whole).
pub(crate) const BODILESS: [Method; 4] = [Method::GET, Method::HEAD, Method::DELETE, Method::TRACE];

/// The method of [`BODILESS`] that `method` is, whatever its case: the rules fold it (`get` is
/// GET to them, as to Werkzeug and Django, which upper-case it).
pub(crate) fn bodiless(method: &Method) -> Option<&'static Method> {
    BODILESS.iter().find(|bodiless| bodiless.as_str().eq_ignore_ascii_case(method.as_str()))
}

/// Methods whose requests declare no length when they have no body (RFC 9110 section 8.6: a
/// client sends none where the method anticipates no content).
fn anticipates_no_body(method: &Method) -> bool {
    bodiless(method).is_some() || method.as_str().eq_ignore_ascii_case("OPTIONS")
}

/// What shaping a request needs.
pub(crate) struct Inbound {
    pub(crate) engine: Arc<Engine<Arc<Backend>>>,
    /// Whether clients reach the proxy over TLS (`X-Forwarded-Proto`).
    pub(crate) https: bool,
    /// Methods of [`BODILESS`] whose bodies are forwarded all the same (`--allow-body-on`).
    pub(crate) bodies_allowed_on: Vec<Method>,
    /// The longest request target (`--http-max-target`).
    pub(crate) max_target_bytes: usize,
    /// The largest request body (`--http-max-body`): 413 above.
    pub(crate) max_body: usize,
    /// Longest the client's body may take to arrive (`--http-request-timeout`).
    pub(crate) request_timeout: Duration,
}

/// The middleware: shapes the request (or refuses it), frames its body (bounded in size and in
/// time), and closes the connection after a 429.
pub(crate) async fn inbound(State(inbound): State<Arc<Inbound>>, mut request: Request, next: Next) -> Response {
    let policy = inbound.engine.current();
    if let Err(refused) = inbound.shape(&mut request, &policy) {
        return refused.response();
    }
    // The fields of the body the rules' estimates read (`estimate = "request.json.…"`).
    let fields = policy.rules.request_fields();
    drop(policy);
    let mut request = match inbound.frame(request).await {
        Ok(request) => request,
        Err(refused) => return refused,
    };
    if !fields.is_empty() && may_be_json(request.headers()) {
        request = match read_estimates(request, &fields, inbound.max_body).await {
            Ok(request) => request,
            Err(refused) => return refused,
        };
    }
    let mut response = next.run(request).await;
    if response.status() == StatusCode::TOO_MANY_REQUESTS {
        close(&mut response);
    }
    response
}

/// Whether the request's body may be JSON: it says so (`application/json`, `…+json`), or says no
/// type at all (FastAPI servers, vLLM's and LiteLLM's among them, parse such a body as JSON and
/// act on it). Only such a body is read for the rules' estimates (an upload of another type is
/// forwarded as it streams).
pub(crate) fn may_be_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(header::CONTENT_TYPE) else { return true };
    let Ok(value) = value.to_str() else { return false };
    let essence = value.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    essence == "application/json" || essence.ends_with("+json")
}

/// Reads the body (framed already: at most `max` bytes) for the fields the rules' estimates read,
/// attached as [`RequestValues`]; the body is forwarded as read.
async fn read_estimates(request: Request, fields: &[RequestField], max: usize) -> Result<Request, Response> {
    let (mut parts, body) = request.into_parts();
    let bytes = match http_body_util::BodyExt::collect(http_body_util::Limited::new(body, max)).await {
        Ok(collected) => collected.to_bytes(),
        Err(error) if body_too_large(&*error) => return Err(too_large(max)),
        Err(error) => return Err(client_error(&*error)),
    };
    parts.extensions.insert(RequestValues::read(fields, &bytes));
    Ok(Request::from_parts(parts, Body::from(bytes)))
}

/// Asks hyper to close the connection after `response`.
pub(crate) fn close(response: &mut Response) {
    response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
}

/// A refusal: the problem, and the connection closed (the request's body is left unread).
pub(crate) fn refuse(status: StatusCode, detail: &str) -> Response {
    let mut response = edge::http::problem(status, detail).map(Body::from);
    close(&mut response);
    response
}

/// 413 for a body over `max` bytes.
fn too_large(max: usize) -> Response {
    refuse(StatusCode::PAYLOAD_TOO_LARGE, &format!("the request body is larger than {max} bytes (--http-max-body)"))
}

/// Whether `error` is the body outgrowing its limit.
fn body_too_large(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(error) = cause {
        if error.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        cause = error.source();
    }
    false
}

/// The client's body failed: it came too slowly (408), or was cut short (400).
pub(crate) fn client_error(error: &(dyn std::error::Error + 'static)) -> Response {
    match too_slow(error) {
        Some(slow) => refuse(StatusCode::REQUEST_TIMEOUT, &slow.to_string()),
        None => refuse(StatusCode::BAD_REQUEST, "the request body was cut short"),
    }
}

/// A request [`Inbound::shape`] refuses: its status and why.
struct Refused(StatusCode, String);

impl Refused {
    fn new(status: StatusCode, detail: impl Into<String>) -> Self {
        Refused(status, detail.into())
    }

    fn response(&self) -> Response {
        refuse(self.0, &self.1)
    }
}

impl Inbound {
    /// Refuses the request, or rewrites it into what the rules read and the upstream receives.
    fn shape(&self, request: &mut Request, policy: &Policy) -> Result<(), Refused> {
        let method = request.method().clone();
        if method == Method::CONNECT {
            return Err(Refused::new(StatusCode::NOT_IMPLEMENTED, "the proxy opens no tunnels (CONNECT)"));
        }
        let uri = request.uri();
        let target =
            uri.path_and_query().map_or(0, |p| p.as_str().len()) + uri.authority().map_or(0, |a| a.as_str().len());
        if target > self.max_target_bytes {
            let detail =
                format!("the request target is longer than {} bytes (--http-max-target)", self.max_target_bytes);
            return Err(Refused::new(StatusCode::URI_TOO_LONG, detail));
        }
        let has_body = request.body().size_hint().exact() != Some(0);
        if has_body && bodiless(&method).is_some_and(|method| !self.bodies_allowed_on.contains(method)) {
            let detail = format!(
                "a {method} request with a body is refused: an upstream that ignores it would read it as another \
                 request (--allow-body-on {method} forwards it)"
            );
            return Err(Refused::new(StatusCode::BAD_REQUEST, detail));
        }
        set_host(request)?;
        let peer = request.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip().to_canonical());
        let trusted = peer.filter(|&peer| policy.rules.trusted_proxies.trusts(peer));
        let headers = request.headers_mut();
        strip_hop_by_hop(headers, |name| {
            name == "host"
                || name == "content-length"
                || name == "transfer-encoding"
                || OWNED.contains(&name)
                || policy.header_names.iter().any(|read| read == name)
        })
        .map_err(|named| {
            let detail = format!(
                "the Connection header names {named}, which the proxy must forward as the rules saw it: refused"
            );
            Refused::new(StatusCode::BAD_REQUEST, detail)
        })?;
        let fingerprints = &policy.rules.fingerprint_headers;
        let fingerprint_names = [&fingerprints.ja3, &fingerprints.ja4].into_iter().flatten().map(String::as_str);
        let spoken_for: Vec<&str> = ["host", "content-length", "transfer-encoding"]
            .into_iter()
            .chain(HOP_BY_HOP)
            .chain(OWNED)
            .chain(policy.header_names.iter().map(String::as_str))
            .chain(fingerprint_names)
            .collect();
        remove_aliases(headers, &spoken_for);
        headers.remove(header::CONTENT_LENGTH);
        headers.remove(header::TRANSFER_ENCODING);
        let proto = HeaderValue::from_static(if self.https { "https" } else { "http" });
        match trusted {
            Some(peer) => {
                append(headers, "x-forwarded-for", &peer.to_string());
                if headers.contains_key(header::FORWARDED) {
                    append(headers, "forwarded", &forwarded_node(peer));
                }
                if !headers.contains_key("x-forwarded-proto") {
                    headers.insert("x-forwarded-proto", proto);
                }
            }
            None => {
                for name in OWNED {
                    headers.remove(name);
                }
                let fingerprints = &policy.rules.fingerprint_headers;
                for name in [&fingerprints.ja3, &fingerprints.ja4].into_iter().flatten() {
                    headers.remove(name.as_str());
                }
                // An address's text is always a valid value.
                if let Some(peer) = peer.and_then(|peer| HeaderValue::from_str(&peer.to_string()).ok()) {
                    headers.insert("x-forwarded-for", peer);
                }
                headers.insert("x-forwarded-proto", proto);
            }
        }
        Ok(())
    }

    /// Frames the body as the upstream will receive it, so that the rules read its
    /// `Content-Length` as the upstream will (a POST's body may be a form naming the method the
    /// application routes it as): a body of known length streams through later, one of unknown
    /// length (chunked) is read first, up to `--http-max-body` (413 above: none of it reaches the
    /// upstream; memory: at most that much per such request in flight). Either must arrive
    /// within the request timeout (408).
    async fn frame(&self, request: Request) -> Result<Request, Response> {
        let (mut parts, body) = request.into_parts();
        let body = Timed::deadline(body, self.request_timeout, Side::Client);
        let (body, length) = match body.size_hint().exact() {
            Some(length) if length > self.max_body as u64 => return Err(too_large(self.max_body)),
            Some(length) => (Body::new(body), length),
            None => match http_body_util::BodyExt::collect(http_body_util::Limited::new(body, self.max_body)).await {
                Ok(collected) => {
                    let bytes = collected.to_bytes();
                    let length = bytes.len() as u64;
                    (Body::from(bytes), length)
                }
                Err(error) if body_too_large(&*error) => return Err(too_large(self.max_body)),
                Err(error) => return Err(client_error(&*error)),
            },
        };
        if length > 0 || !anticipates_no_body(&parts.method) {
            parts.headers.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
        }
        Ok(Request::from_parts(parts, body))
    }
}

/// Checks `Host` (one line; none only with an absolute-form target, whose authority becomes it).
fn set_host(request: &mut Request) -> Result<(), Refused> {
    let lines = request.headers().get_all(header::HOST).iter().count();
    if lines > 1 {
        return Err(Refused::new(
            StatusCode::BAD_REQUEST,
            "the request has more than one Host header (RFC 9112 section 3.2)",
        ));
    }
    if let Some(authority) = request.uri().authority() {
        // The authority without its user information: the host the rules match.
        let host = authority.as_str().rsplit('@').next().unwrap_or_default();
        let host = HeaderValue::from_str(host)
            .map_err(|_| Refused::new(StatusCode::BAD_REQUEST, "the request target's authority is not a host"))?;
        request.headers_mut().insert(header::HOST, host);
    } else if lines == 0 {
        return Err(Refused::new(StatusCode::BAD_REQUEST, "the request has no Host header (RFC 9112 section 3.2)"));
    }
    Ok(())
}

/// Removes the hop-by-hop headers and those `Connection` names; `Err(name)` if it names one
/// `kept` says must be forwarded (nothing is removed then).
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap, kept: impl Fn(&str) -> bool) -> Result<(), String> {
    let mut named = Vec::new();
    for value in headers.get_all(header::CONNECTION) {
        for token in value.as_bytes().split(|&b| b == b',') {
            let Ok(name) = HeaderName::from_bytes(token.trim_ascii()) else { continue };
            if kept(name.as_str()) {
                return Err(name.as_str().to_owned());
            }
            named.push(name);
        }
    }
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    Ok(())
}

/// Removes every header whose name is one of `spoken_for` spelled with `_` for `-` or the
/// other way round (`X_Forwarded_For`, `X-Forwarded_For`; `Api-Key` for `api_key`): CGI, PHP,
/// WSGI and Rack servers name both `HTTP_X_FORWARDED_FOR`, so the application could read the
/// spelling the rules never saw, or the proxy never owned. nginx drops every name with `_` by
/// default; other names with `_` are the application's and are kept.
fn remove_aliases(headers: &mut HeaderMap, spoken_for: &[&str]) {
    let aliases: Vec<HeaderName> = headers
        .keys()
        .filter(|name| {
            let name = name.as_str();
            !spoken_for.iter().any(|taken| taken.eq_ignore_ascii_case(name))
                && spoken_for.iter().any(|taken| same_but_for_underscores(taken, name))
        })
        .cloned()
        .collect();
    for name in aliases {
        headers.remove(name);
    }
}

/// Whether two header names are one with `_` read as `-` (and case ignored).
fn same_but_for_underscores(a: &str, b: &str) -> bool {
    let fold = |byte: u8| if byte == b'_' { b'-' } else { byte.to_ascii_lowercase() };
    a.len() == b.len() && a.bytes().zip(b.bytes()).all(|(a, b)| fold(a) == fold(b))
}

/// Joins every line of `name` in order, then `hop`, into one line.
fn append(headers: &mut HeaderMap, name: &'static str, hop: &str) {
    let mut chain = Vec::new();
    for value in headers.get_all(name) {
        let value = value.as_bytes().trim_ascii();
        if !value.is_empty() {
            chain.extend_from_slice(value);
            chain.extend_from_slice(b", ");
        }
    }
    chain.extend_from_slice(hop.as_bytes());
    // The lines were valid values, and so is the joined one.
    if let Ok(value) = HeaderValue::from_bytes(&chain) {
        headers.insert(name, value);
    }
}

/// `for=ADDRESS` of RFC 7239 (an IPv6 address quoted and in brackets).
fn forwarded_node(peer: IpAddr) -> String {
    match peer {
        IpAddr::V4(v4) => format!("for={v4}"),
        IpAddr::V6(v6) => format!("for=\"[{v6}]\""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_what_connection_names_unless_it_must_be_kept() {
        let mut headers = HeaderMap::new();
        headers.insert("connection", HeaderValue::from_static("close, x-secret, Keep-Alive"));
        headers.insert("x-secret", HeaderValue::from_static("1"));
        headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        headers.insert("x-kept", HeaderValue::from_static("1"));
        assert_eq!(strip_hop_by_hop(&mut headers, |_| false), Ok(()));
        assert_eq!(headers.keys().map(|k| k.as_str()).collect::<Vec<_>>(), ["x-kept"]);

        let mut headers = HeaderMap::new();
        headers.insert("connection", HeaderValue::from_static("close, X-Api-Key"));
        headers.insert("x-api-key", HeaderValue::from_static("k"));
        assert_eq!(strip_hop_by_hop(&mut headers, |name| name == "x-api-key"), Err("x-api-key".to_string()));
        assert!(headers.contains_key("x-api-key"));
    }

    #[test]
    fn removes_only_other_spellings_of_what_is_spoken_for() {
        let mut headers = HeaderMap::new();
        for name in ["x_forwarded_for", "x-forwarded_for", "x-forwarded-for", "api-key", "api_key", "x_trace_id"] {
            headers.insert(HeaderName::from_static(name), HeaderValue::from_static("1"));
        }
        remove_aliases(&mut headers, &["x-forwarded-for", "API_KEY"]);
        let mut kept: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
        kept.sort_unstable();
        assert_eq!(kept, ["api_key", "x-forwarded-for", "x_trace_id"]);
    }

    #[test]
    fn appends_to_every_line_in_order() {
        let mut headers = HeaderMap::new();
        headers.append("x-forwarded-for", HeaderValue::from_static("6.6.6.1"));
        headers.append("x-forwarded-for", HeaderValue::from_static(" "));
        headers.append("x-forwarded-for", HeaderValue::from_static("203.0.113.7"));
        append(&mut headers, "x-forwarded-for", "127.0.0.1");
        assert_eq!(headers.get_all("x-forwarded-for").iter().collect::<Vec<_>>(), ["6.6.6.1, 203.0.113.7, 127.0.0.1"]);
        assert_eq!(forwarded_node("2001:db8::1".parse().unwrap()), "for=\"[2001:db8::1]\"");
    }
}
