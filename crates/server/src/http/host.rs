//! Which `Host` a control-plane listener answers (`serve`'s HTTP API, `tollgate proxy`'s admin
//! listener): a guard on every route, against DNS rebinding. A web page on `rebind.example` whose
//! name is made to resolve to 127.0.0.1 reads and writes `http://rebind.example:8080/` as its own
//! origin, and its requests say `Host: rebind.example:8080`: answering only the names a listener
//! is reached by refuses them (421 Misdirected Request), as nginx's `server_name` and Envoy's
//! virtual hosts do.
//!
//! Answered: an IP literal (`127.0.0.1`, `[::1]`, any address: a literal is never resolved, so it
//! cannot be rebound), `localhost` (browsers resolve it themselves, to loopback), the names the
//! operator allows ([`AllowedHosts::new`]: exact names, `*.suffix` for every name under a suffix,
//! `*` for any), and a request without `Host` (HTTP/1.0: browsers always send one). The port is
//! not compared: a port mapping (a container's `-p 9000:8080`) changes it, and a rebinding page is
//! refused by its name. Two `Host` lines are a 400.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, StatusCode, Uri, header};

/// The names a listener answers besides IP literals and `localhost`, and the flag that adds one
/// (named in refusals).
#[derive(Debug, Clone)]
pub struct AllowedHosts {
    /// Exact names, lowercase, without trailing dots.
    names: Vec<String>,
    /// `*.suffix` entries, as `.suffix`.
    suffixes: Vec<String>,
    /// `*`: any Host.
    any: bool,
    flag: &'static str,
}

/// A name given to `flag` (`--http-allowed-host`, `--admin-allowed-host`), checked: a host name
/// (letters, digits, `-`, `_`, `.`), `*.` before one, or `*`; lowercase, without trailing dots.
pub fn allowed_name(raw: &str) -> Result<String, String> {
    if raw == "*" {
        return Ok(raw.into());
    }
    let (wildcard, host) = raw.strip_prefix("*.").map_or((false, raw), |host| (true, host));
    let host = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    let valid = host.split('.').all(|label| !label.is_empty())
        && host.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    match (valid, wildcard) {
        (true, true) => Ok(format!("*.{host}")),
        (true, false) => Ok(host),
        (false, _) => Err(format!(
            "{raw:?}: give a host name without a port (tollgate.internal), *.SUFFIX for every name under one \
             (*.svc.cluster.local), or * for any"
        )),
    }
}

impl AllowedHosts {
    /// IP literals, `localhost` and `names` (each as [`allowed_name`] takes it; one that is not is
    /// refused), refusing others with a message naming `flag`.
    pub fn new(names: &[String], flag: &'static str) -> Result<Self, String> {
        let mut allowed = AllowedHosts { names: Vec::new(), suffixes: Vec::new(), any: false, flag };
        for name in names {
            let name = allowed_name(name).map_err(|e| format!("{flag} {e}"))?;
            if name == "*" {
                allowed.any = true;
            } else if let Some(suffix) = name.strip_prefix('*') {
                allowed.suffixes.push(suffix.to_string());
            } else {
                allowed.names.push(name);
            }
        }
        Ok(allowed)
    }

    /// Whether a `Host` value (or an absolute-form target's authority) names this listener.
    #[must_use]
    pub fn allows(&self, raw: &str) -> bool {
        let host = tollgate_rules::canonical::host(raw).to_ascii_lowercase();
        self.any
            || host.is_empty()
            || host == "localhost"
            || host.parse::<Ipv4Addr>().is_ok()
            || host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).is_some_and(|h| h.parse::<Ipv6Addr>().is_ok())
            || self.names.contains(&host)
            || self.suffixes.iter().any(|suffix| host.len() > suffix.len() && host.ends_with(suffix.as_str()))
    }

    /// The answer to a request whose target and headers name another host, if they do.
    fn refusal(&self, uri: &Uri, headers: &HeaderMap) -> Option<Response> {
        let mut lines = headers.get_all(header::HOST).iter();
        let (first, second) = (lines.next(), lines.next());
        if second.is_some() {
            return Some(error(StatusCode::BAD_REQUEST, "the request has more than one Host line".into()));
        }
        // The target's host, past any user info (`user:password@host`).
        let target = uri.host();
        let host = first.map(|line| line.to_str().unwrap_or("\u{fffd}"));
        let refused = target.into_iter().chain(host).find(|host| !self.allows(host))?;
        let name = tollgate_rules::canonical::host(refused).to_ascii_lowercase();
        Some(error(
            StatusCode::MISDIRECTED_REQUEST,
            format!(
                "Host {refused:?} is not a name of this server: a web page may be reaching it through DNS \
                 rebinding. Use its address or localhost, or allow the name with {} {name}",
                self.flag
            ),
        ))
    }

    /// `router` with every route guarded.
    pub fn guard(self, router: Router) -> Router {
        router.layer(axum::middleware::from_fn_with_state(Arc::new(self), check))
    }
}

fn error(status: StatusCode, message: String) -> Response {
    (status, axum::Json(serde_json::json!({ "error": message }))).into_response()
}

async fn check(State(allowed): State<Arc<AllowedHosts>>, request: Request, next: Next) -> Response {
    match allowed.refusal(request.uri(), request.headers()) {
        Some(refusal) => refusal,
        None => next.run(request).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_localhost_and_the_allowed_names_are_answered() {
        let names = ["Tollgate.Internal.".to_string(), "*.svc.cluster.local".to_string()];
        let allowed = AllowedHosts::new(&names, "--http-allowed-host").unwrap();
        for host in [
            "127.0.0.1:8080",
            "10.1.2.3",
            "[::1]:8080",
            "[2001:db8::1]",
            "localhost:9000",
            "LocalHost.",
            "tollgate.internal:8080",
            "tollgate.ns.svc.cluster.local",
            "",
        ] {
            assert!(allowed.allows(host), "{host}");
        }
        for host in [
            "rebind.example:8080",
            "127.0.0.1.nip.io",
            "svc.cluster.local",
            "evil-svc.cluster.local",
            "localhost.evil",
            "2130706433",
            "[::1",
            "[rebind.example]",
        ] {
            assert!(!allowed.allows(host), "{host}");
        }
        assert!(AllowedHosts::new(&["*".into()], "--f").unwrap().allows("any.example"));
    }

    /// Before: the target's authority was cut at its first `:`, so `localhost:80@evil.example`
    /// (user `localhost`, password `80`, host `evil.example`) was answered as `localhost`. No
    /// browser sends a target in absolute form to a server, but what is refused is the host the
    /// target names, as the rules read it.
    #[test]
    fn a_targets_host_is_read_past_its_user_info() {
        let allowed = AllowedHosts::new(&[], "--http-allowed-host").unwrap();
        let headers = HeaderMap::new();
        for target in ["http://localhost:80@evil.example/healthz", "http://127.0.0.1@evil.example:8080/"] {
            let uri: Uri = target.parse().unwrap();
            let refusal = allowed.refusal(&uri, &headers).map(|r| r.status());
            assert_eq!(refusal, Some(StatusCode::MISDIRECTED_REQUEST), "{target}");
        }
        for target in ["http://evil.example@localhost:8080/healthz", "http://[::1]:8080/", "http://127.0.0.1/"] {
            let uri: Uri = target.parse().unwrap();
            assert!(allowed.refusal(&uri, &headers).is_none(), "{target}");
        }
    }

    #[test]
    fn names_that_are_not_host_names_are_refused() {
        for bad in ["", "host:8080", "http://host", "a..b", "*.", "**.x", "x.*", "a b"] {
            let error = AllowedHosts::new(&[bad.into()], "--http-allowed-host").unwrap_err();
            assert!(error.starts_with("--http-allowed-host") && error.contains("host name"), "{bad}: {error}");
        }
    }
}
