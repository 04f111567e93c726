//! Request matches: method, path (exact, prefix or glob), host, header present or equal. Every
//! given condition must hold; an empty match matches everything.

use serde::Deserialize;

use crate::Request;

/// A request match, as written in the rules file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Match {
    /// HTTP method, case-insensitive.
    pub method: Option<String>,
    /// The exact path.
    pub path: Option<String>,
    /// A path prefix.
    pub path_prefix: Option<String>,
    /// A path glob: `*` within one segment, `**` across segments, `?` one character.
    pub path_glob: Option<String>,
    /// The host, case-insensitive.
    pub host: Option<String>,
    /// A header that must be present.
    pub header: Option<String>,
    /// A header that must have this exact value.
    pub header_equals: Option<HeaderEquals>,
}

/// `{ name = "x-tier", value = "free" }`
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderEquals {
    /// The header's name (case-insensitive).
    pub name: String,
    /// Its exact value.
    pub value: String,
}

impl Match {
    /// Whether `request` satisfies every condition.
    #[must_use]
    pub fn matches(&self, request: &Request<'_>) -> bool {
        self.method.as_ref().is_none_or(|m| m.eq_ignore_ascii_case(request.method))
            && self.path.as_ref().is_none_or(|p| p == request.path)
            && self.path_prefix.as_ref().is_none_or(|p| request.path.starts_with(p.as_str()))
            && self.path_glob.as_ref().is_none_or(|g| glob(g.as_bytes(), request.path.as_bytes()))
            && self.host.as_ref().is_none_or(|h| h.eq_ignore_ascii_case(request.host))
            && self.header.as_ref().is_none_or(|h| request.header(h).is_some())
            && self.header_equals.as_ref().is_none_or(|h| request.headers_named(&h.name).any(|v| v == h.value))
    }
}

/// `*` matches within one path segment, `**` across segments, `?` one non-`/` byte.
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    match pattern {
        [] => text.is_empty(),
        [b'*', b'*', rest @ ..] => (0..=text.len()).any(|i| glob(rest, &text[i..])),
        [b'*', rest @ ..] => {
            let segment = text.iter().position(|&b| b == b'/').unwrap_or(text.len());
            (0..=segment).any(|i| glob(rest, &text[i..]))
        }
        [b'?', rest @ ..] => text.first().is_some_and(|&b| b != b'/') && glob(rest, &text[1..]),
        [p, rest @ ..] => text.first() == Some(p) && glob(rest, &text[1..]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob(b"/users/*/orders", b"/users/42/orders"));
        assert!(!glob(b"/users/*/orders", b"/users/4/2/orders"));
        assert!(glob(b"/api/**", b"/api/v1/a/b"));
        assert!(glob(b"/v?/x", b"/v1/x") && !glob(b"/v?/x", b"/v//x"));
        assert!(!glob(b"/a", b"/ab"));
    }
}
