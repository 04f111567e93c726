//! The canonical host and method: one spelling for what the application behind acts on, so that
//! no spelling of the same request escapes a rule.
//!
//! - **Host**: the absolute-form target's authority when the request line has one (RFC 9112
//!   section 3.2.2: the server then ignores `Host`, and `tollgate proxy` forwards that authority),
//!   else the `Host` header; without its port, without trailing dots (`api.example.com.` is
//!   `api.example.com` to DNS), compared case-insensitively. A bracketed IPv6 literal keeps its
//!   brackets (`[::1]`).
//! - **Method**: `HEAD` counts as `GET` (most routers send HEAD to the GET handler, which runs
//!   whole): `method = "GET"` matches both and the `method` key spells both `GET`;
//!   `method_exact = "GET"` matches GET alone. Compared case-insensitively.

/// The canonical host of `raw` (a `Host` value or a URI's host): no port, no trailing dot.
#[must_use]
pub fn host(raw: &str) -> &str {
    let without_port = if raw.starts_with('[') {
        raw.find(']').map_or(raw, |end| &raw[..=end])
    } else {
        raw.split(':').next().unwrap_or(raw)
    };
    without_port.trim_end_matches('.')
}

/// Whether a rule's `method` matches `method` (HEAD as GET).
#[must_use]
pub fn method_matches(rule: &str, method: &str) -> bool {
    rule.eq_ignore_ascii_case(method) || (rule.eq_ignore_ascii_case("GET") && method.eq_ignore_ascii_case("HEAD"))
}

/// The method as a key spells it: uppercase, HEAD as GET.
#[must_use]
pub fn method_key(method: &str) -> std::borrow::Cow<'_, str> {
    if method.eq_ignore_ascii_case("HEAD") {
        "GET".into()
    } else if method.bytes().any(|b| b.is_ascii_lowercase()) {
        method.to_ascii_uppercase().into()
    } else {
        method.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts() {
        for spelled in ["api.example.com", "api.example.com.", "api.example.com:443", "api.example.com.:8080"] {
            assert_eq!(host(spelled), "api.example.com", "{spelled}");
        }
        assert_eq!(host("[::1]:8080"), "[::1]");
        assert_eq!(host("[::1]"), "[::1]");
        assert_eq!(host(""), "");
        assert_eq!(host("..."), "");
    }

    #[test]
    fn methods() {
        assert!(method_matches("GET", "HEAD") && method_matches("get", "GET") && !method_matches("HEAD", "GET"));
        assert!(!method_matches("POST", "HEAD"));
        assert_eq!(method_key("head"), "GET");
        assert_eq!(method_key("post"), "POST");
        assert!(matches!(method_key("PUT"), std::borrow::Cow::Borrowed(_)));
    }
}
