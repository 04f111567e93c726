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
//! - **Method overrides** ([`method_is`]): a `POST` is also every method it names in
//!   [`OVERRIDE_HEADERS`] (each line, each comma-separated item) and in a `_method` query
//!   parameter; and, when its body may be a form carrying a `_method` field (a body, by its
//!   `Content-Length` or `Transfer-Encoding`, with a form or multipart `Content-Type` or none), any
//!   method: the rules never read the body. Rack, Laravel and Symfony, Express's method-override, ASP.NET Core and Spring route such
//!   a POST as the method it names (docs/rules.md has the table), so a rule on that method counts
//!   it, as a rule on `POST` still does: over-matching is the safe side. The `method` key stays
//!   the request line's (an override's value is the client's to choose, and where the application
//!   ignores it a key on it would be a fresh budget for each value).

use std::borrow::Cow;

use crate::Request;

/// The headers a method override is read from, lowercase: `X-HTTP-Method-Override` (Rack,
/// Symfony and Laravel, Express's method-override by default, ASP.NET Core, Google APIs),
/// `X-HTTP-Method` (Microsoft's OData and SharePoint) and `X-Method-Override` (IBM; a common
/// method-override getter).
pub const OVERRIDE_HEADERS: [&str; 3] = ["x-http-method-override", "x-http-method", "x-method-override"];

/// The headers that say whether a POST's body may carry a `_method` form field.
pub const BODY_HEADERS: [&str; 3] = ["content-type", "content-length", "transfer-encoding"];

/// The query parameter and form field a method override is read from.
pub const OVERRIDE_FIELD: &str = "_method";

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

/// Whether `request` may be routed as a method `accepts`: its own, or (a `POST`) one it names
/// in an override header or `_method` query parameter, or any when its body may be a form (see
/// the module docs).
pub fn method_is(request: &Request<'_>, accepts: impl Fn(&str) -> bool) -> bool {
    if accepts(request.method) {
        return true;
    }
    if !request.method.eq_ignore_ascii_case("POST") {
        return false;
    }
    let named =
        |value: &[u8]| std::str::from_utf8(value).is_ok_and(|text| text.split(',').map(str::trim).any(&accepts));
    form_body(request)
        || OVERRIDE_HEADERS.iter().any(|header| request.headers_named(header).any(named))
        || query_overrides(request.query).any(|value| named(&value))
}

/// Whether a POST's body may be a form, whose `_method` field the rules cannot read: there is a
/// body (a `Content-Length` other than 0, or a `Transfer-Encoding`: an HTTP/1.1 request without
/// either has none), and a form or multipart `Content-Type` (Rack, PHP, Spring and ASP.NET Core
/// parse those), or none at all (Rack reads such a body as a form).
fn form_body(request: &Request<'_>) -> bool {
    let body = request.headers_named("transfer-encoding").next().is_some()
        || request.headers_named("content-length").any(|length| length.trim_ascii() != b"0");
    if !body {
        return false;
    }
    let mut types = request.headers_named("content-type").peekable();
    if types.peek().is_none() {
        return true;
    }
    types.any(|value| {
        let media = value.split(|&b| b == b';').next().unwrap_or_default().trim_ascii();
        media.eq_ignore_ascii_case(b"application/x-www-form-urlencoded")
            || media.len() > 10 && media[..10].eq_ignore_ascii_case(b"multipart/")
    })
}

/// Every value of the `_method` query parameter, percent-decoded, whether `&` or `;` separates
/// pairs (servers disagree: over-matching is the safe side).
fn query_overrides(query: &str) -> impl Iterator<Item = Cow<'_, [u8]>> {
    query
        .split(['&', ';'])
        .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
        .filter(|(name, _)| crate::normalize::query_value(name) == OVERRIDE_FIELD.as_bytes())
        .map(|(_, value)| crate::normalize::query_value(value))
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
