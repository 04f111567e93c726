//! Request matches: method, path (exact, prefix or glob), host, header present or equal. Every
//! given condition must hold; an empty match matches everything. Paths are compared after
//! normalisation (see `normalize`; the rules normalise the request's path once), hosts and
//! methods in their canonical forms (see `canonical`: `method = "GET"` matches HEAD too).

use serde::Deserialize;

use crate::Request;

/// A request match, as written in the rules file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Match {
    /// HTTP method, case-insensitive; `GET` matches HEAD too.
    pub method: Option<String>,
    /// HTTP method, case-insensitive, exactly (`GET` is not HEAD).
    pub method_exact: Option<String>,
    /// The exact path.
    pub path: Option<String>,
    /// A path prefix.
    pub path_prefix: Option<String>,
    /// A path glob: `*` within one segment, `**` across segments, `?` one character.
    pub path_glob: Option<Glob>,
    /// The host, case-insensitive.
    pub host: Option<String>,
    /// A header that must be present.
    pub header: Option<String>,
    /// A header that must have this exact value (on any of its lines).
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
    /// Whether `request`, whose normalised path is `path`, satisfies every condition.
    #[must_use]
    pub fn matches(&self, request: &Request<'_>, path: &str) -> bool {
        self.method.as_ref().is_none_or(|m| crate::canonical::method_matches(m, request.method))
            && self.method_exact.as_ref().is_none_or(|m| m.eq_ignore_ascii_case(request.method))
            && self.path.as_ref().is_none_or(|p| p == path)
            && self.path_prefix.as_ref().is_none_or(|p| path.starts_with(p.as_str()))
            && self.path_glob.as_ref().is_none_or(|g| g.matches(path))
            && self.host.as_ref().is_none_or(|h| crate::canonical::host(h).eq_ignore_ascii_case(request.host))
            && self.header.as_ref().is_none_or(|h| request.headers_named(h).next().is_some())
            && self
                .header_equals
                .as_ref()
                .is_none_or(|h| request.headers_named(&h.name).any(|v| v == h.value.as_bytes()))
    }
}

/// One element of a glob.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token {
    Byte(u8),
    /// `?`: one byte, not `/`.
    One,
    /// `*`: any run of bytes within a segment.
    Segment,
    /// `**`: any run of bytes, across segments.
    Any,
}

/// A path glob, compiled: `*` matches within one segment, `**` across segments, `?` one non-`/`
/// byte. Matching simulates the pattern as an automaton (the set of positions reachable so far),
/// so a path costs O(path × pattern) whatever the stars: no backtracking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob {
    text: String,
    tokens: Vec<Token>,
}

/// The longest glob accepted, in bytes.
const MAX_GLOB: usize = 1024;

impl TryFrom<String> for Glob {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        if text.len() > MAX_GLOB {
            return Err(format!("path_glob longer than {MAX_GLOB} bytes"));
        }
        let bytes = text.as_bytes();
        let mut tokens = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            let token = match bytes[i] {
                b'*' if bytes.get(i + 1) == Some(&b'*') => {
                    i += 1;
                    Token::Any
                }
                b'*' => Token::Segment,
                b'?' => Token::One,
                byte => Token::Byte(byte),
            };
            // Consecutive stars add nothing but work.
            if !(matches!(token, Token::Any | Token::Segment) && tokens.last() == Some(&token)) {
                tokens.push(token);
            }
            i += 1;
        }
        Ok(Glob { text, tokens })
    }
}

impl<'de> Deserialize<'de> for Glob {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Glob::try_from(String::deserialize(deserializer)?).map_err(serde::de::Error::custom)
    }
}

impl Glob {
    /// The glob as written.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether `path` matches.
    #[must_use]
    pub fn matches(&self, path: &str) -> bool {
        self.run(path, &mut 0)
    }

    /// [`matches`](Self::matches), counting the positions visited in `steps`.
    fn run(&self, path: &str, steps: &mut u64) -> bool {
        let n = self.tokens.len();
        let mut now = vec![false; n + 1];
        let mut next = vec![false; n + 1];
        now[0] = true;
        self.close(&mut now);
        for &byte in path.as_bytes() {
            next.iter_mut().for_each(|s| *s = false);
            let mut any = false;
            for (i, token) in self.tokens.iter().enumerate() {
                if !now[i] {
                    continue;
                }
                *steps += 1;
                let (stay, advance) = match *token {
                    Token::Byte(b) => (false, b == byte),
                    Token::One => (false, byte != b'/'),
                    Token::Segment => (byte != b'/', false),
                    Token::Any => (true, false),
                };
                next[i] |= stay;
                next[i + 1] |= advance;
                any |= stay || advance;
            }
            if !any {
                return false;
            }
            std::mem::swap(&mut now, &mut next);
            self.close(&mut now);
        }
        now[n]
    }

    /// Adds the positions reachable by skipping stars (they match the empty string).
    fn close(&self, states: &mut [bool]) {
        for (i, token) in self.tokens.iter().enumerate() {
            if states[i] && matches!(token, Token::Segment | Token::Any) {
                states[i + 1] = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn glob(pattern: &str, path: &str) -> bool {
        Glob::try_from(pattern.to_string()).unwrap().matches(path)
    }

    #[test]
    fn globs() {
        assert!(glob("/users/*/orders", "/users/42/orders"));
        assert!(!glob("/users/*/orders", "/users/4/2/orders"));
        assert!(glob("/api/**", "/api/v1/a/b"));
        assert!(glob("/api/**", "/api/"));
        assert!(glob("/v?/x", "/v1/x") && !glob("/v?/x", "/v//x"));
        assert!(!glob("/a", "/ab"));
        assert!(glob("**/admin", "/x/y/admin") && glob("/*", "/") && !glob("/*", "/a/b"));
        assert!(glob("/a*b*c", "/aXXbYYc") && !glob("/a*b*c", "/aXXbYY"));
    }

    /// Before: `**` globs backtracked, on the order of path^stars steps. A 4 KB path against six
    /// `**` now visits at most path × pattern positions.
    #[test]
    fn a_long_path_against_many_stars_is_one_pass() {
        let pattern = Glob::try_from("/**a**a**a**a**a**b".to_string()).unwrap();
        let path = format!("/{}", "a".repeat(4096));
        let mut steps = 0;
        assert!(!pattern.run(&path, &mut steps));
        assert!(steps <= (path.len() as u64 + 1) * (pattern.tokens.len() as u64 + 1), "{steps} steps");
    }
}
