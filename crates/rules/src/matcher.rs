//! Request matches: method, path (exact, prefix or glob), host, header present or equal. Every
//! given condition must hold; an empty match matches everything. Paths are compared as the rule's
//! `path_match` says: by default as applications route them (see `route`: the patterns folded
//! when the rules load, the request's path in every form a backend may route it in, each without
//! and with a trailing slash), or as spelled (`exact`, see `normalize`). Hosts and methods are compared in
//! their canonical forms (see `canonical`: `method = "GET"` matches HEAD too).

use serde::Deserialize;

use crate::Request;
use crate::route::{self, Pattern, RequestPath};
use crate::rules::PathMatch;

/// A request match, as written in the rules file (its path patterns then folded by
/// [`routed`](Self::routed) unless its rule says `path_match = "exact"`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Match {
    /// HTTP method, case-insensitive; `GET` matches HEAD too.
    pub method: Option<String>,
    /// HTTP method, case-insensitive, exactly (`GET` is not HEAD).
    pub method_exact: Option<String>,
    /// The path (the whole path, not a prefix).
    pub path: Option<String>,
    /// A path prefix (of bytes: `/api` is a prefix of `/apix`, `/api/` is not).
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
    /// Whether `request`, whose path is `path`, satisfies every condition, its paths compared as
    /// `mode` says.
    #[must_use]
    pub fn matches(&self, request: &Request<'_>, path: &RequestPath<'_>, mode: PathMatch) -> bool {
        self.method.as_ref().is_none_or(|m| crate::canonical::method_matches(m, request.method))
            && self.method_exact.as_ref().is_none_or(|m| m.eq_ignore_ascii_case(request.method))
            && self.host.as_ref().is_none_or(|h| crate::canonical::host(h).eq_ignore_ascii_case(request.host))
            && self.header.as_ref().is_none_or(|h| request.headers_named(h).next().is_some())
            && self
                .header_equals
                .as_ref()
                .is_none_or(|h| request.headers_named(&h.name).any(|v| v == h.value.as_bytes()))
            && self.path_matches(path, mode)
    }

    /// Whether the path conditions hold: on any form a backend may route the path in (`routed`),
    /// or on the path as spelled (`exact`).
    fn path_matches(&self, path: &RequestPath<'_>, mode: PathMatch) -> bool {
        if self.path.is_none() && self.path_prefix.is_none() && self.path_glob.is_none() {
            return true;
        }
        match mode {
            PathMatch::Exact => self.paths_hold(path.exact(), false),
            PathMatch::Routed => path.forms().any(|form| self.paths_hold(form, true)),
        }
    }

    /// Whether every path condition holds on `path`; with `either_slash`, on `path` or on `path`
    /// with a trailing slash (one route to the backends that fold it: the routing form has none).
    fn paths_hold(&self, path: &str, either_slash: bool) -> bool {
        let prefixes = |prefix: &str| {
            path.starts_with(prefix)
                || either_slash && prefix.len() == path.len() + 1 && prefix.starts_with(path) && prefix.ends_with('/')
        };
        self.path.as_ref().is_none_or(|p| p == path)
            && self.path_prefix.as_ref().is_none_or(|p| prefixes(p))
            && self
                .path_glob
                .as_ref()
                .is_none_or(|g| if either_slash { g.matches_either_slash(path) } else { g.matches(path) })
    }

    /// This match with its path patterns in the routing form (`path_match = "routed"`, the
    /// default: the rules fold their patterns when they load).
    #[must_use]
    pub fn routed(mut self) -> Self {
        self.path = self.path.map(|p| route::pattern(&p, Pattern::Path));
        self.path_prefix = self.path_prefix.map(|p| route::pattern(&p, Pattern::Prefix));
        self.path_glob = self.path_glob.map(|g| Glob::compile(route::pattern(g.as_str(), Pattern::Glob)));
        self
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
        Ok(Glob::compile(text))
    }
}

impl Glob {
    /// `text` compiled (its length checked by the caller: a folded glob is at most three times
    /// the written one, each byte beyond ASCII becoming `%XX`).
    fn compile(text: String) -> Glob {
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
        Glob { text, tokens }
    }
}

impl<'de> Deserialize<'de> for Glob {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Glob::try_from(String::deserialize(deserializer)?).map_err(serde::de::Error::custom)
    }
}

impl Glob {
    /// The glob's text (as written, or folded by [`Match::routed`]).
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether `path` matches.
    #[must_use]
    pub fn matches(&self, path: &str) -> bool {
        self.run(path, false, &mut 0)
    }

    /// Whether `path`, or `path` with a trailing slash, matches (in one pass).
    #[must_use]
    pub fn matches_either_slash(&self, path: &str) -> bool {
        self.run(path, true, &mut 0)
    }

    /// [`matches`](Self::matches) (or with `slash_too`,
    /// [`matches_either_slash`](Self::matches_either_slash)), counting the positions visited in
    /// `steps`.
    fn run(&self, path: &str, slash_too: bool, steps: &mut u64) -> bool {
        let n = self.tokens.len();
        let mut now = vec![false; n + 1];
        let mut next = vec![false; n + 1];
        now[0] = true;
        self.close(&mut now);
        for &byte in path.as_bytes() {
            if !self.step(&mut now, &mut next, byte, steps) {
                return false;
            }
        }
        if now[n] {
            return true;
        }
        // `step` moves `now` on.
        slash_too && self.step(&mut now, &mut next, b'/', steps) && now[n]
    }

    /// Moves the positions reached, `now`, over `byte` (`next` is scratch space); false if none is
    /// left.
    fn step(&self, now: &mut Vec<bool>, next: &mut Vec<bool>, byte: u8, steps: &mut u64) -> bool {
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
        std::mem::swap(now, next);
        self.close(now);
        any
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

    #[test]
    fn a_glob_holds_on_a_path_with_or_without_a_trailing_slash() {
        let either =
            |pattern: &str, path: &str| Glob::try_from(pattern.to_string()).unwrap().matches_either_slash(path);
        assert!(either("/api/**", "/api") && either("/api/**", "/api/x") && !either("/api/**", "/apix"));
        assert!(either("/a/*/", "/a/b") && !either("/a/*/", "/a/b/c"));
        assert!(either("/a", "/a") && !either("/a", "/ab"));
        assert!(!glob("/api/**", "/api"), "matches alone asks for the path as it is");
    }

    /// Before: `**` globs backtracked, on the order of path^stars steps. A 4 KB path against six
    /// `**` now visits at most path × pattern positions.
    #[test]
    fn a_long_path_against_many_stars_is_one_pass() {
        let pattern = Glob::try_from("/**a**a**a**a**a**b".to_string()).unwrap();
        let path = format!("/{}", "a".repeat(4096));
        let mut steps = 0;
        assert!(!pattern.run(&path, false, &mut steps));
        assert!(steps <= (path.len() as u64 + 1) * (pattern.tokens.len() as u64 + 1), "{steps} steps");
    }
}
