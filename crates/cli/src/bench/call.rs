//! The HTTP and gRPC targets: request-response calls, one in flight per worker.
//!
//! HTTP/1.1 has no usable pipelining, so each HTTP worker owns a connection (`-c` of them, `-P`
//! must be 1). gRPC multiplexes: each of the `-c` connections is one HTTP/2 channel shared by
//! `-P` workers, each with one call in flight.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tollgate_rls::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use tollgate_rls::{RateLimitDescriptor, RateLimitRequest, RateLimitServiceClient};
use tonic::transport::Channel;

use super::keys::{Keys, Rng, Template};
use super::record::{Answer, Failure, Recorder, Shared, Tally};
use super::schedule::Schedule;

/// The largest HTTP response body read (the rest makes the request an error).
const MAX_BODY_BYTES: usize = 1 << 20;
/// The pause after a call that could not reach the server, so a dead server is not spun on.
const FAILURE_PAUSE: Duration = Duration::from_millis(10);

/// An HTTP request with `{key}` placeholders in its URL and body.
#[derive(Debug)]
pub(crate) struct HttpTarget {
    /// `host:port` to connect to.
    addr: String,
    method: Method,
    url: Template,
    body: Option<Template>,
    headers: Vec<(HeaderName, HeaderValue)>,
}

impl HttpTarget {
    pub(crate) fn new(url: &str, method: &str, body: Option<&str>, headers: &[String]) -> Result<HttpTarget, String> {
        let url_template = Template::new(url);
        let sample: Uri = String::from_utf8_lossy(&url_template.render(b"0"))
            .parse()
            .map_err(|e| format!("--url {url:?} is not a URL: {e}"))?;
        match sample.scheme_str() {
            Some("http") => {}
            Some("https") => return Err("https is not built into tollgate bench: use an http:// URL".into()),
            _ => return Err(format!("--url {url:?} must start with http://")),
        }
        let host = sample.host().ok_or_else(|| format!("--url {url:?} has no host"))?;
        if url.split("://").nth(1).is_some_and(|rest| rest.split('/').next().is_some_and(|a| a.contains("{key}"))) {
            return Err(format!("--url {url:?}: {{key}} may be in the path or query, not the host"));
        }
        let addr = format!("{host}:{}", sample.port_u16().unwrap_or(80));
        let method =
            Method::from_bytes(method.as_bytes()).map_err(|_| format!("--method {method:?} is not an HTTP method"))?;
        let mut parsed = Vec::new();
        for header in headers {
            let (name, value) =
                header.split_once(':').ok_or_else(|| format!("--header {header:?} must be 'Name: value'"))?;
            let name =
                HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| format!("--header {header:?}: bad name"))?;
            let value = HeaderValue::from_str(value.trim()).map_err(|_| format!("--header {header:?}: bad value"))?;
            parsed.push((name, value));
        }
        if body.is_some() && !parsed.iter().any(|(n, _)| n == http::header::CONTENT_TYPE) {
            parsed.push((http::header::CONTENT_TYPE, HeaderValue::from_static("application/json")));
        }
        Ok(HttpTarget { addr, method, url: url_template, body: body.map(Template::new), headers: parsed })
    }

    pub(crate) fn has_key(&self) -> bool {
        self.url.has_key() || self.body.as_ref().is_some_and(Template::has_key)
    }

    /// `host:port` the requests go to.
    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }

    fn request(&self, key: &[u8]) -> Result<Request<Full<Bytes>>, Failure> {
        let uri: Uri = String::from_utf8_lossy(&self.url.render(key)).parse().map_err(|e| {
            Failure::Transport(format!("the URL for key {:?} is not valid: {e}", String::from_utf8_lossy(key)))
        })?;
        let body = self.body.as_ref().map_or_else(Bytes::new, |b| Bytes::from(b.render(key)));
        let mut request =
            Request::builder().method(self.method.clone()).uri(uri.path_and_query().map_or("/", |p| p.as_str()));
        if let Some(authority) = uri.authority() {
            request = request.header(http::header::HOST, authority.as_str());
        }
        for (name, value) in &self.headers {
            request = request.header(name, value);
        }
        request.body(Full::new(body)).map_err(|e| Failure::Transport(format!("cannot build the request: {e}")))
    }
}

/// Envoy's rate-limit call with `{key}` placeholders in descriptor values.
#[derive(Debug)]
pub(crate) struct GrpcTarget {
    pub(crate) addr: String,
    domain: String,
    /// Descriptors, each a list of `(key, value template)`.
    descriptors: Vec<Vec<(String, Template)>>,
}

impl GrpcTarget {
    pub(crate) fn new(addr: &str, domain: &str, descriptors: &[String]) -> Result<GrpcTarget, String> {
        if descriptors.is_empty() {
            return Err("give at least one --descriptor key=value[,key=value]".into());
        }
        let parsed = descriptors
            .iter()
            .map(|d| {
                d.split(',')
                    .map(|entry| match entry.split_once('=') {
                        Some((key, value)) if !key.is_empty() => Ok((key.to_string(), Template::new(value))),
                        _ => Err(format!("--descriptor {d:?}: each entry is key=value")),
                    })
                    .collect::<Result<Vec<_>, _>>()
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(GrpcTarget { addr: addr.to_string(), domain: domain.to_string(), descriptors: parsed })
    }

    pub(crate) fn has_key(&self) -> bool {
        self.descriptors.iter().flatten().any(|(_, v)| v.has_key())
    }

    fn request(&self, key: &[u8]) -> RateLimitRequest {
        let descriptors = self
            .descriptors
            .iter()
            .map(|entries| RateLimitDescriptor {
                entries: entries
                    .iter()
                    .map(|(k, v)| Entry { key: k.clone(), value: String::from_utf8_lossy(&v.render(key)).into_owned() })
                    .collect(),
                limit: None,
                hits_addend: None,
            })
            .collect();
        RateLimitRequest { domain: self.domain.clone(), descriptors, hits_addend: 0 }
    }
}

/// One worker's way to make a call.
pub(crate) enum Caller {
    Http { target: Arc<HttpTarget>, sender: Option<SendRequest<Full<Bytes>>> },
    Grpc { target: Arc<GrpcTarget>, client: RateLimitServiceClient<Channel> },
}

impl Caller {
    /// A gRPC channel for `-P` workers to share; it connects on first use and again after a
    /// failure.
    pub(crate) fn grpc_channel(target: &GrpcTarget, timeout: Duration) -> Result<Channel, String> {
        Ok(tonic::transport::Endpoint::from_shared(format!("http://{}", target.addr))
            .map_err(|e| format!("--addr {:?}: {e}", target.addr))?
            .connect_timeout(timeout)
            .tcp_nodelay(true)
            .connect_lazy())
    }

    async fn call(&mut self, key: &[u8]) -> Result<Answer, Failure> {
        match self {
            Caller::Http { target, sender } => {
                let request = target.request(key)?;
                let result = http_call(target, sender, request).await;
                if matches!(result, Err(Failure::Transport(_))) {
                    *sender = None;
                }
                result
            }
            Caller::Grpc { target, client } => match client.should_rate_limit(target.request(key)).await {
                Ok(response) => match response.into_inner().overall_code {
                    1 => Ok(Answer::Allowed),
                    2 => Ok(Answer::Denied),
                    code => Err(Failure::Reply(format!("overall_code {code} (neither OK nor OVER_LIMIT)"))),
                },
                Err(status) if status.code() == tonic::Code::Unavailable => {
                    Err(Failure::Transport(format!("gRPC unavailable: {}", status.message())))
                }
                Err(status) => Err(Failure::Reply(format!("gRPC {:?}: {}", status.code(), status.message()))),
            },
        }
    }
}

async fn http_call(
    target: &HttpTarget,
    sender: &mut Option<SendRequest<Full<Bytes>>>,
    request: Request<Full<Bytes>>,
) -> Result<Answer, Failure> {
    if sender.as_ref().is_none_or(SendRequest::is_closed) {
        *sender = Some(http_connect(&target.addr).await.map_err(Failure::Transport)?);
    }
    let Some(ready) = sender.as_mut() else { unreachable!("connected just above") };
    ready.ready().await.map_err(|e| Failure::Transport(format!("connection failed: {e}")))?;
    let response = ready.send_request(request).await.map_err(|e| Failure::Transport(format!("request failed: {e}")))?;
    let status = response.status();
    let decision_headers = response.headers().keys().any(|name| {
        let name = name.as_str();
        name == "ratelimit" || name == "ratelimit-policy" || name.starts_with("x-ratelimit")
    });
    let body = Limited::new(response.into_body(), MAX_BODY_BYTES)
        .collect()
        .await
        .map_err(|e| Failure::Transport(format!("reading the body failed: {e}")))?
        .to_bytes();
    http_answer(status, decision_headers, &body)
}

/// What an HTTP response means: 429 is a denial; a 2xx is an admission when it carries
/// rate-limit headers or an `"allowed"` field (tollgate's `/v1/check`), else a plain reply;
/// any other status is an error reply.
fn http_answer(status: StatusCode, decision_headers: bool, body: &[u8]) -> Result<Answer, Failure> {
    if status == StatusCode::TOO_MANY_REQUESTS {
        return Ok(Answer::Denied);
    }
    if !status.is_success() {
        let text = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
        return Err(Failure::Reply(format!("HTTP {status}: {text}")));
    }
    let allowed_field = |value: &[u8]| body.windows(value.len()).any(|w| w == value);
    if allowed_field(b"\"allowed\":false") {
        Ok(Answer::Denied)
    } else if decision_headers || allowed_field(b"\"allowed\":true") {
        Ok(Answer::Allowed)
    } else {
        Ok(Answer::Other)
    }
}

async fn http_connect(addr: &str) -> Result<SendRequest<Full<Bytes>>, String> {
    let stream = tokio::net::TcpStream::connect(addr).await.map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    stream.set_nodelay(true).map_err(|e| format!("cannot set TCP_NODELAY: {e}"))?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("HTTP handshake with {addr} failed: {e}"))?;
    // The connection task ends when the sender is dropped or the server closes.
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

/// One worker: takes tickets until the schedule is exhausted, one call in flight at a time.
pub(crate) async fn worker(
    id: u64,
    mut caller: Caller,
    keys: Arc<Keys>,
    timeout: Duration,
    schedule: Arc<Schedule>,
    shared: Arc<Shared>,
) -> Tally {
    let mut recorder = Recorder::new(shared);
    let mut rng = Rng::seeded(id);
    while let Some(ticket) = schedule.take(Instant::now()) {
        tokio::time::sleep_until(ticket.wake().into()).await;
        let start = ticket.start(Instant::now());
        let number = keys.pick(&mut rng);
        let key = keys.name(number);
        let outcome = match tokio::time::timeout(timeout, caller.call(&key)).await {
            Ok(outcome) => outcome,
            Err(_) => {
                // The call was abandoned mid-way: an HTTP/1.1 connection cannot be reused.
                if let Caller::Http { sender, .. } = &mut caller {
                    *sender = None;
                }
                Err(Failure::Timeout)
            }
        };
        let unreachable = matches!(outcome, Err(Failure::Transport(_)));
        recorder.record_key(number, start, Instant::now(), outcome);
        if unreachable {
            tokio::time::sleep(FAILURE_PAUSE).await;
        }
    }
    recorder.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_targets_are_checked_before_the_run() {
        let target =
            HttpTarget::new("http://localhost:8080/v1/check?k={key}", "POST", Some("{\"key\":\"{key}\"}"), &[])
                .unwrap();
        assert_eq!(target.addr, "localhost:8080");
        assert!(target.has_key());
        let request = target.request(b"k1").unwrap();
        assert_eq!(request.uri(), "/v1/check?k=k1");
        assert_eq!(request.headers()["host"], "localhost:8080");
        assert_eq!(request.headers()["content-type"], "application/json");
        assert!(HttpTarget::new("https://x/", "GET", None, &[]).unwrap_err().contains("https"));
        assert!(HttpTarget::new("x/", "GET", None, &[]).is_err());
        assert!(HttpTarget::new("http://{key}.x/", "GET", None, &[]).is_err());
        assert!(HttpTarget::new("http://x/", "G T", None, &[]).is_err());
        assert!(HttpTarget::new("http://x/", "GET", None, &["nocolon".into()]).is_err());
        assert_eq!(HttpTarget::new("http://x/", "GET", None, &[]).unwrap().addr, "x:80");
    }

    #[test]
    fn http_statuses_and_bodies_are_decisions_or_errors() {
        let ok = StatusCode::OK;
        assert_eq!(http_answer(StatusCode::TOO_MANY_REQUESTS, false, b""), Ok(Answer::Denied));
        assert_eq!(http_answer(ok, false, br#"{"allowed":true,"limit":1}"#), Ok(Answer::Allowed));
        assert_eq!(http_answer(ok, false, br#"{"allowed":false}"#), Ok(Answer::Denied));
        assert_eq!(http_answer(ok, true, b"hello"), Ok(Answer::Allowed));
        assert_eq!(http_answer(ok, false, b"hello"), Ok(Answer::Other));
        assert!(
            matches!(http_answer(StatusCode::SERVICE_UNAVAILABLE, false, b"down"), Err(Failure::Reply(t)) if t.contains("503"))
        );
    }

    #[test]
    fn grpc_descriptors_take_the_key() {
        let target = GrpcTarget::new("127.0.0.1:8081", "api", &["user={key},path=/x".into()]).unwrap();
        assert!(target.has_key());
        let request = target.request(b"u1");
        assert_eq!(request.domain, "api");
        let entries: Vec<_> =
            request.descriptors[0].entries.iter().map(|e| (e.key.as_str(), e.value.as_str())).collect();
        assert_eq!(entries, [("user", "u1"), ("path", "/x")]);
        assert!(GrpcTarget::new("a:1", "d", &[]).is_err());
        assert!(GrpcTarget::new("a:1", "d", &["novalue".into()]).is_err());
    }
}
