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
//! - **Method overrides** ([`method_is`]): a request is also every method it names in an
//!   override header ([`OVERRIDE_HEADERS`], each line, each comma-separated item read past the
//!   bytes around it that are not visible ASCII, `_` read as `-` in the name as CGI-style
//!   servers read it), whatever its own method (Slim 3 and 4 read the
//!   header on any method); and a `POST` every method it names in a `_method` query parameter (the
//!   name as PHP reads it: [`names_override`]) and, when its body may carry a `_method` field (a
//!   body, by its `Content-Length` or `Transfer-Encoding`, with a form, multipart or JSON
//!   `Content-Type`, or none), any method: the rules never read the body. Rack, Laravel and
//!   Symfony, Express's method-override, ASP.NET Core, Spring and Slim route such a request as the
//!   method it names (docs/rules.md has the table), so a rule on that method counts it, as a rule
//!   on its own method still does: over-matching is the safe side. The `method` key stays the
//!   request line's (an override's value is the client's to choose, and where the application
//!   ignores it a key on it would be a fresh budget for each value).

use std::borrow::Cow;

use crate::Request;

/// The headers a method override is read from, lowercase: `X-HTTP-Method-Override` (Rack,
/// Symfony and Laravel, Express's method-override by default, ASP.NET Core, Slim, Google APIs),
/// `X-HTTP-Method` (Microsoft's OData and SharePoint) and `X-Method-Override` (IBM; a common
/// method-override getter).
pub const OVERRIDE_HEADERS: [&str; 3] = ["x-http-method-override", "x-http-method", "x-method-override"];

/// Every spelling of [`OVERRIDE_HEADERS`] with `_` for any `-`: a CGI-style server turns each `-`
/// of a name into `_`, so where it keeps names spelled with `_` (Unicorn and WEBrick for Rack,
/// among others), `X_HTTP_METHOD_OVERRIDE` reaches the application as `X-HTTP-Method-Override`
/// does. The headers the middleware copies for the rules.
pub const OVERRIDE_HEADER_SPELLINGS: [&str; 16] = [
    "x-http-method-override",
    "x-http-method_override",
    "x-http_method-override",
    "x-http_method_override",
    "x_http-method-override",
    "x_http-method_override",
    "x_http_method-override",
    "x_http_method_override",
    "x-http-method",
    "x-http_method",
    "x_http-method",
    "x_http_method",
    "x-method-override",
    "x-method_override",
    "x_method-override",
    "x_method_override",
];

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

/// Whether `request` may be routed as a method `accepts`: its own, one it names in an override
/// header, or (a `POST`) one it names in a `_method` query parameter, or any when its body may
/// carry a `_method` field (see the module docs).
pub fn method_is(request: &Request<'_>, accepts: impl Fn(&str) -> bool) -> bool {
    if accepts(request.method) {
        return true;
    }
    let named = |value: &[u8]| value.split(|&b| b == b',').any(|item| names_method(item, &accepts));
    if request.headers.iter().any(|&(name, value)| is_override_header(name) && named(value)) {
        return true;
    }
    request.method.eq_ignore_ascii_case("POST")
        && (body_may_name_method(request) || query_overrides(request.query).any(|value| named(&value)))
}

/// Whether an item of an override's value names a method `accepts`, read past any byte around it
/// that is not a visible ASCII character: a method is ASCII, and servers trim what they read as
/// spaces (Node reads header bytes as Latin-1, where 0xA0 is a space to JavaScript's `trim`).
fn names_method(item: &[u8], accepts: impl Fn(&str) -> bool) -> bool {
    let start = item.iter().position(u8::is_ascii_graphic);
    let end = item.iter().rposition(u8::is_ascii_graphic);
    let (Some(start), Some(end)) = (start, end) else { return false };
    std::str::from_utf8(&item[start..=end]).is_ok_and(accepts)
}

/// Whether a header's name is one of [`OVERRIDE_HEADERS`], `_` read as `-`.
fn is_override_header(name: &str) -> bool {
    let same = |canonical: &str| {
        name.len() == canonical.len()
            && name
                .bytes()
                .zip(canonical.bytes())
                .all(|(b, want)| b.eq_ignore_ascii_case(&want) || (b == b'_' && want == b'-'))
    };
    OVERRIDE_HEADERS.iter().any(|canonical| same(canonical))
}

/// Whether a POST's body may carry a `_method` field, which the rules cannot read: there is a
/// body (a `Content-Length` other than 0, or a `Transfer-Encoding`: an HTTP/1.1 request without
/// either has none), and a form or multipart `Content-Type` (Rack, PHP, Spring and ASP.NET Core
/// parse those; the media type read up to a `;`, `,` or space, as Rack and PHP read it), a JSON one (one holding `/json` or `+json`: Laravel reads such a body as its
/// parameters, Slim's body parsing too), or none at all (Rack reads such a body as a form).
fn body_may_name_method(request: &Request<'_>) -> bool {
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
        // The media type ends where any server ends it: `;`, `,` (Rack), a space (PHP).
        let value = value.trim_ascii_start();
        let media = value.split(|&b| matches!(b, b';' | b',' | b' ' | b'\t')).next().unwrap_or_default();
        let json = value.windows(5).any(|w| w[1..].eq_ignore_ascii_case(b"json") && matches!(w[0], b'/' | b'+'));
        json || media.eq_ignore_ascii_case(b"application/x-www-form-urlencoded")
            || media.len() > 10 && media[..10].eq_ignore_ascii_case(b"multipart/")
    })
}

/// Every value of a `_method` query parameter ([`names_override`]), percent-decoded, whether `&`
/// or `;` separates pairs (servers disagree: over-matching is the safe side).
fn query_overrides(query: &str) -> impl Iterator<Item = Cow<'_, [u8]>> {
    query
        .split(['&', ';'])
        .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
        .filter(|(name, _)| names_override(&crate::normalize::query_value(name)))
        .map(|(_, value)| crate::normalize::query_value(value))
}

/// Whether a decoded query parameter name is `_method` as PHP reads it for Laravel and Symfony:
/// leading spaces dropped, the name ended at a NUL byte, `.` and ` ` read as `_` (so `.method`,
/// `+_method` and `_method%00x` are `_method` there).
fn names_override(name: &[u8]) -> bool {
    let name = name.split(|&b| b == 0).next().unwrap_or_default();
    let name = &name[name.iter().take_while(|&&b| b == b' ').count()..];
    name.len() == OVERRIDE_FIELD.len()
        && name
            .iter()
            .zip(OVERRIDE_FIELD.bytes())
            .all(|(&b, want)| b == want || (want == b'_' && matches!(b, b'.' | b' ')))
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
    fn every_spelling_of_the_override_headers_is_copied() {
        let expected: usize = OVERRIDE_HEADERS.iter().map(|name| 1 << name.matches('-').count()).sum();
        let mut spellings = OVERRIDE_HEADER_SPELLINGS.to_vec();
        spellings.sort_unstable();
        spellings.dedup();
        assert_eq!(spellings.len(), expected);
        assert!(spellings.iter().all(|name| is_override_header(name) && *name == name.to_ascii_lowercase()));
        assert!(!is_override_header("x-http-method-overrid") && !is_override_header("x.http.method"));
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
