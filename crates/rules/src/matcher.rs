//! Request matches: method, path (exact, prefix, glob or regex), host (or a host regex), header
//! present, equal or matching a regex (see `pattern`). Every
//! given condition must hold; an empty match matches everything. Paths are compared as the rule's
//! `path_match` says: by default as applications route them (see `route`: the patterns folded
//! when the rules load, the request's path in every form a backend may route it in, each without
//! and with a trailing slash), or as spelled (`exact`, see `normalize`). Hosts and methods are compared in
//! their canonical forms (see `canonical`: `method = "GET"` matches HEAD too, and a request matches
//! the methods its overrides name).

mod pattern;

use serde::Deserialize;

pub use pattern::{HeaderRegex, Regex};

use crate::Request;
use crate::route::{self, Pattern, RequestPath};
use crate::rules::PathMatch;

/// A request match, as written in the rules file (its path patterns then folded by
/// [`routed`](Self::routed) unless its rule says `path_match = "exact"`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Match {
    /// HTTP method, case-insensitive; `GET` matches HEAD too, and a request the methods its
    /// overrides name.
    pub method: Option<String>,
    /// HTTP method, case-insensitive, exactly (`GET` is not HEAD); a request matches the methods its
    /// overrides name.
    pub method_exact: Option<String>,
    /// The path (the whole path, not a prefix).
    pub path: Option<String>,
    /// A path prefix (of bytes: `/api` is a prefix of `/apix`, `/api/` is not).
    pub path_prefix: Option<String>,
    /// A path glob: `*` within one segment, `**` across segments, `?` one character.
    pub path_glob: Option<Glob>,
    /// A path regex, a full match on the path in the form the other path conditions compare
    /// (ASCII letters in any case when routed).
    #[serde(default, deserialize_with = "pattern::exact_case")]
    pub path_regex: Option<Regex>,
    /// The host, case-insensitive.
    pub host: Option<String>,
    /// A host regex, a full match on the canonical host (no port, no trailing dot), in any case.
    #[serde(default, deserialize_with = "pattern::any_case")]
    pub host_regex: Option<Regex>,
    /// A header that must be present.
    pub header: Option<String>,
    /// A header that must have this exact value (on any of its lines).
    pub header_equals: Option<HeaderEquals>,
    /// A header with a line a regex matches in full.
    pub header_regex: Option<HeaderRegex>,
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
        use crate::canonical::{method_is, method_matches};
        self.method.as_ref().is_none_or(|m| method_is(request, |method| method_matches(m, method)))
            && self.method_exact.as_ref().is_none_or(|m| method_is(request, |method| m.eq_ignore_ascii_case(method)))
            && self.host.as_ref().is_none_or(|h| crate::canonical::host(h).eq_ignore_ascii_case(request.host))
            && self.host_regex.as_ref().is_none_or(|r| r.matches(request.host.as_bytes()))
            && self.header.as_ref().is_none_or(|h| request.headers_named(h).next().is_some())
            && self
                .header_equals
                .as_ref()
                .is_none_or(|h| request.headers_named(&h.name).any(|v| v == h.value.as_bytes()))
            && self.header_regex.as_ref().is_none_or(|h| request.headers_named(&h.name).any(|v| h.pattern.matches(v)))
            && self.path_matches(path, mode)
    }

    /// Whether the path conditions hold: on any form a backend may route the path in (`routed`),
    /// or on the path as spelled (`exact`).
    fn path_matches(&self, path: &RequestPath<'_>, mode: PathMatch) -> bool {
        if self.path.is_none() && self.path_prefix.is_none() && self.path_glob.is_none() && self.path_regex.is_none() {
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
            && self
                .path_regex
                .as_ref()
                .is_none_or(|r| r.matches(path.as_bytes()) || either_slash && r.matches(format!("{path}/").as_bytes()))
    }

    /// This match with its path patterns in the routing form (`path_match = "routed"`, the
    /// default: the rules fold their patterns when they load), its path regex matching ASCII
    /// letters in any case (the routing form lowercases them). An error if the regex, so
    /// compiled, is too large.
    pub fn routed(mut self) -> Result<Self, String> {
        self.path = self.path.map(|p| route::pattern(&p, Pattern::Path));
        self.path_prefix = self.path_prefix.map(|p| route::pattern(&p, Pattern::Prefix));
        self.path_glob = self.path_glob.map(|g| Glob::compile(route::pattern(g.as_str(), Pattern::Glob)));
        self.path_regex = match self.path_regex {
            Some(r) => Some(r.case_insensitive().map_err(|e| format!("path_regex {:?}: {e}", r.as_str()))?),
            None => None,
        };
        Ok(self)
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
/// byte. Matching simulates the pattern as an automaton whose reachable positions are a bit set
/// (64 positions to a word), so a path costs O(path × pattern / 64) word operations whatever the
/// stars: no backtracking. A request is compared in up to 18 forms (see `route`), each up to three
/// times its 64 KiB: one word a byte (a glob of up to 63 tokens) keeps that to milliseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob {
    text: String,
    /// The position after the last token: reaching it matches.
    end: usize,
    /// Words per set of positions (positions `0..=end`).
    words: usize,
    /// For each byte, 1 + the index of the mask of the tokens that are that byte (0: none is).
    byte_mask: [u16; 256],
    /// Those masks, `words` each.
    byte_masks: Vec<u64>,
    /// The tokens `?` (a byte but `/` moves past them), `*` (a byte but `/` stays on them), `**`
    /// (any byte stays on them), and both stars (skipped: they match the empty string).
    one: Vec<u64>,
    segment: Vec<u64>,
    any: Vec<u64>,
    stars: Vec<u64>,
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
        let tokens = tokens(text.as_bytes());
        let end = tokens.len();
        let words = end / 64 + 1;
        let mask = || vec![0u64; words];
        let (mut one, mut segment, mut any, mut stars) = (mask(), mask(), mask(), mask());
        let (mut byte_mask, mut byte_masks) = ([0u16; 256], Vec::new());
        for (position, token) in tokens.iter().enumerate() {
            let (word, bit) = (position / 64, 1u64 << (position % 64));
            match *token {
                Token::Byte(byte) => {
                    if byte_mask[usize::from(byte)] == 0 {
                        byte_masks.extend(mask());
                        // At most 256 masks: one per byte value.
                        byte_mask[usize::from(byte)] = u16::try_from(byte_masks.len() / words).unwrap_or(u16::MAX);
                    }
                    let index = usize::from(byte_mask[usize::from(byte)]) - 1;
                    byte_masks[index * words + word] |= bit;
                }
                Token::One => one[word] |= bit,
                Token::Segment => segment[word] |= bit,
                Token::Any => any[word] |= bit,
            }
            if matches!(token, Token::Segment | Token::Any) {
                stars[word] |= bit;
            }
        }
        Glob { text, end, words, byte_mask, byte_masks, one, segment, any, stars }
    }
}

/// The tokens of a glob's bytes.
fn tokens(bytes: &[u8]) -> Vec<Token> {
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
    tokens
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
    /// [`matches_either_slash`](Self::matches_either_slash)), counting the words visited in
    /// `steps`.
    fn run(&self, path: &str, slash_too: bool, steps: &mut u64) -> bool {
        if self.words == 1 {
            // Most globs (up to 63 tokens): the positions in one register.
            let mut now = self.closed(0, 1);
            for &byte in path.as_bytes() {
                *steps += 1;
                now = self.closed(0, self.moved(0, now, byte).0);
                if now == 0 {
                    return false;
                }
            }
            let end = 1 << self.end;
            return now & end != 0 || slash_too && self.closed(0, self.moved(0, now, b'/').0) & end != 0;
        }
        let mut now = vec![0u64; self.words];
        let mut next = vec![0u64; self.words];
        now[0] = 1;
        self.close(&mut now);
        for &byte in path.as_bytes() {
            if !self.step(&now, &mut next, byte, steps) {
                return false;
            }
            std::mem::swap(&mut now, &mut next);
        }
        if self.reached_end(&now) {
            return true;
        }
        slash_too && self.step(&now, &mut next, b'/', steps) && self.reached_end(&next)
    }

    fn reached_end(&self, positions: &[u64]) -> bool {
        positions[self.end / 64] & (1 << (self.end % 64)) != 0
    }

    /// The positions of word `word` reached from `positions` over `byte` (without skipping
    /// stars), and the carry into the next word.
    fn moved(&self, word: usize, positions: u64, byte: u8) -> (u64, u64) {
        let mut advance = match usize::from(self.byte_mask[usize::from(byte)]) {
            0 => 0,
            index => self.byte_masks[(index - 1) * self.words + word],
        };
        let mut stay = self.any[word];
        if byte != b'/' {
            advance |= self.one[word];
            stay |= self.segment[word];
        }
        let advanced = positions & advance;
        (advanced << 1 | positions & stay, advanced >> 63)
    }

    /// `positions` (of word `word`, with what skipping stars carries into it) and the positions
    /// reachable from them by skipping stars within the word: runs of stars are short (`**` then
    /// `*` at most), so this loops once or twice.
    fn closed(&self, word: usize, mut positions: u64) -> u64 {
        loop {
            let added = (positions & self.stars[word]) << 1 & !positions;
            if added == 0 {
                return positions;
            }
            positions |= added;
        }
    }

    /// The positions reached from `now` over `byte`, into `next`; false if none is.
    fn step(&self, now: &[u64], next: &mut [u64], byte: u8, steps: &mut u64) -> bool {
        let mut carry = 0;
        for (word, next) in next.iter_mut().enumerate() {
            *steps += 1;
            let (moved, out) = self.moved(word, now[word], byte);
            *next = moved | carry;
            carry = out;
        }
        self.close(next);
        next.iter().any(|&word| word != 0)
    }

    /// Adds the positions reachable by skipping stars (they match the empty string), across
    /// words.
    fn close(&self, positions: &mut [u64]) {
        let mut carry = 0;
        for (word, positions) in positions.iter_mut().enumerate() {
            *positions = self.closed(word, *positions | carry);
            // A star in the word's last position skips into the next word.
            carry = (*positions & self.stars[word]) >> 63;
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
    /// `**` now visits at most one word per byte (a word holds 64 positions).
    #[test]
    fn a_long_path_against_many_stars_is_one_pass() {
        let pattern = Glob::try_from("/**a**a**a**a**a**b".to_string()).unwrap();
        let path = format!("/{}", "a".repeat(4096));
        let mut steps = 0;
        assert!(!pattern.run(&path, false, &mut steps));
        assert!(steps <= path.len() as u64 * pattern.words as u64, "{steps} steps");
        // A glob of 1 KiB (3 KiB once folded) is at most 49 words a byte.
        let long = Glob::compile(format!("/**{}**x", "a?*".repeat(1020)));
        assert!(long.words > 40 && long.words <= 49, "{} words", long.words);
        let mut steps = 0;
        assert!(!long.run(&path, true, &mut steps));
        assert!(steps <= (path.len() as u64 + 1) * long.words as u64, "{steps} steps");
    }

    /// The glob's meaning, by backtracking (exponential: for short inputs only).
    fn reference(pattern: &[u8], path: &[u8]) -> bool {
        let rest = |skip: usize| (0..=path.len()).any(|i| reference(&pattern[skip..], &path[i..]));
        match pattern {
            [] => path.is_empty(),
            [b'*', b'*', ..] => rest(2),
            [b'*', ..] => (0..=path.len())
                .take_while(|&i| !path[..i].contains(&b'/'))
                .any(|i| reference(&pattern[1..], &path[i..])),
            [b'?', ..] => path.first().is_some_and(|&b| b != b'/') && reference(&pattern[1..], &path[1..]),
            [byte, ..] => path.first() == Some(byte) && reference(&pattern[1..], &path[1..]),
        }
    }

    /// Every string up to `length` bytes of `alphabet`.
    fn strings(alphabet: &[u8], length: usize) -> Vec<Vec<u8>> {
        let (mut all, mut level) = (vec![Vec::new()], vec![Vec::new()]);
        for _ in 0..length {
            level = level.iter().flat_map(|s| alphabet.iter().map(move |&b| [s.as_slice(), &[b]].concat())).collect();
            all.extend(level.iter().cloned());
        }
        all
    }

    /// Whether `glob` agrees with the glob's meaning on `path`, with and without a trailing slash.
    fn agrees(pattern: &[u8], path: &[u8]) {
        let glob = Glob::compile(String::from_utf8(pattern.to_vec()).unwrap());
        let (shown, text) = (String::from_utf8_lossy(pattern), std::str::from_utf8(path).unwrap());
        assert_eq!(glob.matches(text), reference(pattern, path), "{shown} on {text}");
        let slashed = reference(pattern, path) || reference(pattern, &[path, b"/"].concat());
        assert_eq!(glob.matches_either_slash(text), slashed, "{shown} on {text} or {text}/");
    }

    /// The automaton agrees with the glob's meaning on every pattern and path of the bytes that
    /// matter, up to 5 bytes each, and across the boundary of its first word (64 positions).
    #[test]
    fn the_automaton_agrees_with_backtracking() {
        let paths = strings(b"a/b", 5);
        for pattern in strings(b"a/*?", 5) {
            for path in &paths {
                agrees(&pattern, path);
            }
        }
        let (patterns, paths) = (strings(b"a/*?", 3), strings(b"a/b", 3));
        for length in 58..=68 {
            for pad in [b"a".repeat(length), b"?".repeat(length)] {
                for pattern in &patterns {
                    for path in &paths {
                        agrees(&[pad.as_slice(), pattern].concat(), &[b"a".repeat(length).as_slice(), path].concat());
                    }
                }
            }
        }
    }
}
