//! HTTP sent to the RESP port: a web page's `fetch("http://127.0.0.1:6380/", {method: "POST",
//! body})` is a "simple" cross-site request, sent without a CORS preflight, and a RESP parser
//! reads its request line, its header lines and its body as inline commands: the body's
//! `CL.THROTTLE victim ...` would run. Redis closes a connection whose command is `POST` or
//! `Host:` ("Possible SECURITY ATTACK detected"); so does tollgate, and on any request line
//! (`METHOD TARGET HTTP/x`), answering one error first. Nothing after that line is run.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// The error answered before the connection is closed.
pub(super) const ERROR: &str = "ERR Possible SECURITY ATTACK detected: an HTTP request on the RESP port (a web page's cross-protocol request?); \
     connection closed";

/// Whether the command `args` is a line of an HTTP request: `POST` or `Host:` as its name (as
/// Redis checks), or a request line, `METHOD TARGET HTTP/DIGIT…` with a target in origin form
/// (`/…`), absolute form (`…://…`) or `*`.
pub(super) fn is_http(args: &[&[u8]]) -> bool {
    let name = args[0];
    let method = |text: &[u8]| !text.is_empty() && text.iter().all(|b| b.is_ascii_alphabetic() || *b == b'-');
    let target = |text: &[u8]| text.starts_with(b"/") || text == b"*" || text.windows(3).any(|w| w == b"://");
    let version = |text: &[u8]| text.len() > 5 && text[..5].eq_ignore_ascii_case(b"HTTP/") && text[5].is_ascii_digit();
    name.eq_ignore_ascii_case(b"POST")
        || name.eq_ignore_ascii_case(b"HOST:")
        || matches!(args, [m, t, v] if method(m) && target(t) && version(v))
}

/// Logs the attempt, at most once a minute (a page can open connections in a loop).
pub(super) fn warn() {
    static LOGGED: AtomicU64 = AtomicU64::new(0);
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let last = LOGGED.load(Ordering::Relaxed);
    if now >= last.saturating_add(60)
        && LOGGED.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
    {
        tracing::warn!(
            "an HTTP request reached the RESP port (a web page's cross-protocol request, or a client on the wrong \
             port): connection closed (logged at most once a minute)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_lines_are_told_from_commands() {
        let http: [&[&[u8]]; 5] = [
            &[b"POST", b"/", b"HTTP/1.1"],
            &[b"post"],
            &[b"Host:", b"127.0.0.1:6380"],
            &[b"GET", b"/healthz", b"HTTP/1.0"],
            &[b"M-SEARCH", b"*", b"http/1.1"],
        ];
        for args in http {
            assert!(is_http(args), "{args:?}");
        }
        let commands: [&[&[u8]]; 6] = [
            &[b"GET", b"/x"],
            &[b"PING"],
            &[b"ECHO", b"HTTP/1.1"],
            &[b"TG.LIMIT", b"api", b"HTTP/1.1"],
            &[b"CLIENT", b"SETNAME", b"HTTP/1.1"],
            &[b"SET", b"/k", b"HTTP/x"],
        ];
        for args in commands {
            assert!(!is_http(args), "{args:?}");
        }
    }
}
