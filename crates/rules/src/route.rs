//! A path as applications route it: the form a rule's paths are compared and keyed in by default
//! (`path_match = "routed"`), so that a rule on a path counts every request some common backend
//! routes to that path (docs/rules.md, "Paths as applications route them"). Over-matching is the
//! safe side for a limiter.
//!
//! The **routing form** of a path folds every difference some common backend ignores:
//! - `;params` are cut from every segment (Tomcat and Spring: `/login;jsessionid=1` is `/login`;
//!   a `;` that arrives percent-encoded is a character, as it is to Tomcat);
//! - `\`, `%2F` and `%5C` separate segments (WHATWG URLs and IIS read `\` as `/`; gunicorn, uWSGI
//!   and Go decode `%2F` before Flask, Django and Go's routers see the path);
//! - every other escape is decoded: a byte that is printable ASCII (but `%`, `/`, `\`, `;`, `?`,
//!   `#`) is written as itself, any other byte as `%XX` (uppercase hex), so `/caf%c3%a9`, `/café`
//!   and `/caf%C3%A9` are one path and the form is ASCII; `%uHHHH` is the character's UTF-8 bytes
//!   (IIS decodes it: `/%u0061dmin` is `/admin` to classic ASP.NET); a `%` that starts no escape
//!   is `%25`;
//! - ASCII letters are lowercased (Express and ASP.NET route case-insensitively; letters beyond
//!   ASCII keep their case);
//! - empty segments are dropped (`//`: nginx's `merge_slashes`, Werkzeug, Tomcat);
//! - `.` and `..` segments are resolved after decoding (`%2e%2e` and `..;` are `..`), never above
//!   the root (Tomcat, Go, ASP.NET, WHATWG URLs);
//! - a trailing slash is dropped (Express, ASP.NET and Spring 5 route `/login/` to `/login`).
//!
//! A rule's patterns are folded the same way when the rules load (`/Admin/Login/` means the same
//! route as `/admin/login`); a prefix or glob keeps a trailing slash it is written with, and a
//! request's path is compared both without and with one (`/api/**` covers `/api/`, which folds to
//! `/api`).
//!
//! Four of these steps change a path's structure (cutting `;params`, `%2F` separating, `\` and
//! `%5C` separating, resolving dot segments), and backends take some of them, not all:
//! Express takes none (it sees `/public/..%2Fadmin` under `/public/`), Flask behind gunicorn
//! decodes `%2F` and resolves nothing, Spring 6 cuts `;params` and resolves nothing, ASP.NET Core
//! resolves dot segments but keeps `%2F`, `\` and `;` (`/login/x%2Fy/..` is `/login/` to it), nginx
//! decodes `%2F` and resolves dot segments but keeps `\` and `;`. So a request is compared in
//! **every form** some combination of those steps gives, `%uHHHH` left as it is (the routing form
//! takes all of them, the **literal form** none), and in IIS's (`%uHHHH`, `%2F` and `\` decoded,
//! dot segments resolved, `;` kept), and a rule matches if any form does; combinations that differ
//! only in a step the path gives no occasion for (no `%2F`, no `\`, no `;`, no `%u`) are one, so
//! a path already in the routing form is compared once and any path at most 18 times. A `path`
//! key is the routing form, but where the forms resolve dot segments differently (see
//! [`RequestPath::key`]).
//!
//! Work is linear in the path (at most 64 KiB: the `http` crate refuses longer targets) for each
//! form, nothing panics on any input, and every form is a fixed point (folding it again the same
//! way changes nothing).

mod forms;

use std::borrow::Cow;

pub use forms::RequestPath;

/// The routing form of a request's path (see the module docs).
#[must_use]
pub fn path(raw: &str) -> Cow<'_, str> {
    if is_routed(raw.as_bytes()) { Cow::Borrowed(raw) } else { Cow::Owned(fold(raw, ROUTED)) }
}

/// The literal form of a request's path (see the module docs): the routing form's folding but
/// for what changes the path's structure.
#[must_use]
pub fn literal(raw: &str) -> Cow<'_, str> {
    if is_routed(raw.as_bytes()) { Cow::Borrowed(raw) } else { Cow::Owned(fold(raw, LITERAL)) }
}

/// A rule's pattern in the routing form: a `path` as a request's path, a `path_prefix` or
/// `path_glob` keeping the trailing slash it is written with (`/api/` is not the prefix `/api`),
/// and a glob its start as written (`**/admin` stays relative).
#[must_use]
pub fn pattern(raw: &str, kind: Pattern) -> String {
    let how = match kind {
        Pattern::Path => ROUTED,
        Pattern::Prefix => Fold { trailing_slash: true, ..ROUTED },
        Pattern::Glob => Fold { trailing_slash: true, rooted: false, ..ROUTED },
    };
    fold(raw, how)
}

/// Which kind of pattern [`pattern`] folds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// `match.path`.
    Path,
    /// `match.path_prefix`.
    Prefix,
    /// `match.path_glob`.
    Glob,
}

/// How [`fold`] treats a path: which structural steps it takes (the routing form all, the literal
/// form none; each backend some).
#[derive(Debug, Clone, Copy)]
struct Fold {
    /// `%2F` separates segments (gunicorn, uWSGI, nginx, IIS; else it is a character, as to
    /// Express, Kestrel and Go).
    slash_escapes: bool,
    /// `\` and `%5C` separate segments (IIS, WHATWG URLs, Tomcat's `allowBackslash`).
    backslashes: bool,
    /// `;` starts a segment's parameters (Tomcat, Spring).
    params: bool,
    /// Dot segments are resolved (Tomcat, Kestrel, nginx, IIS, WHATWG URLs).
    dots: bool,
    /// `%uHHHH` is an escape (IIS); else it is itself.
    percent_u: bool,
    /// A trailing slash is kept (patterns: a prefix `/api/` is not `/api`).
    trailing_slash: bool,
    /// The result starts with `/` (requests; a glob starts as written).
    rooted: bool,
}

const ROUTED: Fold = Fold {
    slash_escapes: true,
    backslashes: true,
    params: true,
    dots: true,
    percent_u: true,
    trailing_slash: false,
    rooted: true,
};
const LITERAL: Fold =
    Fold { slash_escapes: false, backslashes: false, params: false, dots: false, percent_u: false, ..ROUTED };

/// The folded form of `raw` (see the module docs). One pass; `..` truncates what was written.
fn fold(raw: &str, how: Fold) -> String {
    // A glob that starts at the root keeps it (`/` is not the empty glob).
    let starts_at_root =
        Decoded::new(raw, how.percent_u).next().is_some_and(|(byte, escaped)| separates(byte, escaped, how));
    let how = Fold { rooted: how.rooted || starts_at_root, ..how };
    let mut out = String::with_capacity(raw.len() + 1);
    // Where the current segment starts in `out` (at its '/', if it has one), and its text.
    let (mut start, mut text) = (0, 0);
    if how.rooted {
        out.push('/');
        text = 1;
    }
    let mut in_params = false;
    for (byte, escaped) in Decoded::new(raw, how.percent_u) {
        let separator = separates(byte, escaped, how);
        // Parameters run to the next raw separator (Tomcat parses them before decoding).
        let raw_separator = separator && !escaped;
        if in_params && !raw_separator {
            continue;
        }
        if separator {
            end_segment(&mut out, start, text, how);
            start = out.len();
            out.push('/');
            text = out.len();
            in_params = false;
        } else if how.params && byte == b';' && !escaped {
            in_params = true;
        } else {
            write_byte(&mut out, byte, escaped);
        }
    }
    let dropped = end_segment(&mut out, start, text, how);
    if how.trailing_slash && dropped && !out.is_empty() && !out.ends_with('/') {
        out.push('/');
    }
    if how.rooted && out.is_empty() {
        out.push('/');
    }
    out
}

/// The bytes of a path, each with whether it came from an escape: `%XX`, or (with `percent_u`)
/// `%uHHHH`, whose character gives its UTF-8 bytes (IIS decodes it: http.sys's `PercentUAllowed`,
/// on by default); a `%` that starts neither is itself.
struct Decoded<'a> {
    bytes: &'a [u8],
    /// Whether `%uHHHH` is an escape.
    percent_u: bool,
    /// A `%uHHHH` escape's UTF-8 bytes, and the range of them still to give.
    pending: ([u8; 4], std::ops::Range<usize>),
}

impl<'a> Decoded<'a> {
    fn new(raw: &'a str, percent_u: bool) -> Self {
        Decoded { bytes: raw.as_bytes(), percent_u, pending: ([0; 4], 0..0) }
    }
}

impl Iterator for Decoded<'_> {
    type Item = (u8, bool);

    fn next(&mut self) -> Option<(u8, bool)> {
        let (utf8, left) = &mut self.pending;
        if let Some(at) = left.next() {
            return Some((utf8[at], true));
        }
        let (&first, rest) = self.bytes.split_first()?;
        if first == b'%' {
            if let Some(byte) = hex_pair(rest.get(..2)) {
                self.bytes = &rest[2..];
                return Some((byte, true));
            }
            if let Some(character) = percent_u(rest).filter(|_| self.percent_u) {
                self.bytes = &rest[5..];
                *left = 1..character.encode_utf8(utf8).len();
                return Some((utf8[0], true));
            }
        }
        self.bytes = rest;
        Some((first, false))
    }
}

/// The character of a `%uHHHH` escape, given what follows its `%` (none for a surrogate).
fn percent_u(rest: &[u8]) -> Option<char> {
    let [b'u' | b'U', digits @ ..] = rest.get(..5)? else { return None };
    let digits = std::str::from_utf8(digits).ok().filter(|d| d.bytes().all(|b| b.is_ascii_hexdigit()))?;
    char::from_u32(u32::from_str_radix(digits, 16).ok()?)
}

/// Whether `byte` separates segments.
fn separates(byte: u8, escaped: bool, how: Fold) -> bool {
    match byte {
        b'/' => !escaped || how.slash_escapes,
        b'\\' => how.backslashes,
        _ => false,
    }
}

/// Ends the segment that starts at `start` in `out` (its text at `text`): an empty one is dropped
/// (a doubled or trailing slash), and with `how.dots` a `.` is dropped and a `..` drops the
/// segment before it too. Whether the segment was dropped.
fn end_segment(out: &mut String, start: usize, text: usize, how: Fold) -> bool {
    match &out[text..] {
        "" => out.truncate(start),
        "." if how.dots => out.truncate(start),
        ".." if how.dots => {
            let before = out[..start].rfind('/').unwrap_or(0);
            out.truncate(before);
        }
        _ => return false,
    }
    true
}

/// Writes `byte` (decoded from an escape if `escaped`) in its one spelling: printable ASCII as
/// itself, lowercased (but `%`, `/`, `\` and `;`, and `?` and `#` from an escape), any other byte
/// as an uppercase `%XX`.
fn write_byte(out: &mut String, byte: u8, escaped: bool) {
    if is_plain(byte) && !(escaped && matches!(byte, b'?' | b'#')) {
        out.push(char::from(byte.to_ascii_lowercase()));
    } else {
        const HEX: &[u8; 16] = b"0123456789ABCDEF";
        out.push('%');
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
}

/// A byte written as itself when it is not from an escape.
fn is_plain(byte: u8) -> bool {
    (0x21..=0x7e).contains(&byte) && !matches!(byte, b'%' | b'/' | b'\\' | b';')
}

fn hex_pair(pair: Option<&[u8]>) -> Option<u8> {
    let [high, low] = pair? else { return None };
    let digit = |b: u8| char::from(b).to_digit(16);
    u8::try_from(digit(*high)? * 16 + digit(*low)?).ok()
}

/// Whether `path` is already in the routing form (most paths; one pass, as it runs on every
/// request): it starts with `/`, and has only lowercase plain bytes, escapes as [`write_byte`]
/// writes them and single slashes, no dot segment and no trailing slash.
fn is_routed(path: &[u8]) -> bool {
    if path.first() != Some(&b'/') {
        return false;
    }
    if path.len() == 1 {
        return true;
    }
    let mut segment_start = 1;
    let mut i = 1;
    while i < path.len() {
        match path[i] {
            b'/' => {
                if !is_word(&path[segment_start..i]) {
                    return false;
                }
                segment_start = i + 1;
            }
            b'%' => {
                let upper_hex = |b: &u8| b.is_ascii_digit() || (b'A'..=b'F').contains(b);
                let pair = path.get(i + 1..i + 3).filter(|pair| pair.iter().all(upper_hex));
                match hex_pair(pair) {
                    Some(byte) if !is_plain(byte) && byte != b'/' && byte != b'\\' || matches!(byte, b'?' | b'#') => {}
                    _ => return false,
                }
                i += 2;
            }
            byte if !is_plain(byte) || byte.is_ascii_uppercase() => return false,
            _ => {}
        }
        i += 1;
    }
    is_word(&path[segment_start..])
}

/// A segment the routing form keeps as it is: not empty, not a dot segment.
fn is_word(segment: &[u8]) -> bool {
    !matches!(segment, b"" | b"." | b"..")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Before this module, every spelling but the first two reached a rule on `/admin/login` as
    /// another path.
    #[test]
    fn spellings_backends_route_to_one_path_are_one_path() {
        for spelled in [
            "/admin/login",
            "//admin/./login",
            "/admin%2Flogin",
            "/admin%2flogin",
            "/admin\\login",
            "/admin%5clogin",
            "/admin/login;jsessionid=1",
            "/admin;a=1/login;b=2;c",
            "/ADMIN/Login",
            "/admin/login/",
            "/admin/login%2F",
            "/admin/x/..%2Flogin",
            "/admin/x/..;/login",
            "/admin/x/%2e%2e/login",
            "/%61dmin/%4Cogin",
            "//Admin\\x%2F..%2F%4Cogin;jsessionid=1/",
        ] {
            assert_eq!(path(spelled), "/admin/login", "{spelled}");
        }
    }

    #[test]
    fn other_bytes_have_one_spelling() {
        assert_eq!(path("/caf%c3%a9"), "/caf%C3%A9");
        assert_eq!(path("/café"), "/caf%C3%A9", "raw UTF-8 as its escapes");
        assert_eq!(path("/a%3Bb"), "/a%3Bb", "an encoded ; is a character, not a parameter");
        assert_eq!(path("/a%3fb%23c%20d"), "/a%3Fb%23c%20d");
        assert_eq!(path("/100%25"), "/100%25");
        assert_eq!(path("/a%2541"), "/a%2541", "decoded once, as servers do");
        assert_eq!(path("/%zz/%4/%"), "/%25zz/%254/%25", "a % that starts no escape is itself");
        assert_eq!(path("/a%00b"), "/a%00b");
        assert_eq!(path("/%7E%2D%5F"), "/~-_");
    }

    /// IIS decodes `%uHHHH` (http.sys's `PercentUAllowed`, on by default) before classic ASP.NET
    /// routes the path. Before: `/%u0061dmin%u002Flogin` was `/%25u0061dmin%25u002flogin`, another
    /// path than `/admin/login`.
    #[test]
    fn percent_u_escapes_are_decoded_as_iis_decodes_them() {
        assert_eq!(path("/%u0061dmin%u002Flogin"), "/admin/login");
        assert_eq!(path("/%U0041DMIN/%u004c%u006F%u0067%u0069%u006e"), "/admin/login");
        assert_eq!(path("/caf%u00e9"), "/caf%C3%A9", "as its UTF-8 escapes");
        assert_eq!(path("/a%u005Cb/x/%u002e%u002E"), "/a/b");
        assert_eq!(path("/a%u003Bb"), "/a%3Bb", "an encoded ; is a character");
        assert_eq!(literal("/a%u002Fb"), "/a%25u002fb", "the literal form decodes no %u");
        // Only IIS decodes them: to Kestrel `%u002E%u002E` is a name, which the `..` after it
        // drops, so a form leaves them as they are.
        let kestrel = RequestPath::new("/admin/login/%u002E%u002E/..");
        assert_eq!(kestrel.routed(), "/");
        assert!(kestrel.forms().any(|form| form == "/admin/login"), "{:?}", kestrel.forms().collect::<Vec<_>>());
        assert_eq!(path("/%uD800/%u12/%u"), "/%25ud800/%25u12/%25u", "no character: kept");
    }

    #[test]
    fn the_root_and_what_climbs_above_it() {
        for root in ["", "/", "//", "/.", "/..", "/../..", "\\", "%2F", ";x", "/;x/", "/a/.."] {
            assert_eq!(path(root), "/", "{root:?}");
        }
        assert_eq!(path("/../a"), "/a");
        assert_eq!(path("a/b"), "/a/b", "a path is rooted");
        assert_eq!(path("*"), "/*");
    }

    #[test]
    fn the_literal_form_keeps_structure() {
        assert_eq!(literal("/public/..%2Fadmin"), "/public/..%2Fadmin");
        assert_eq!(literal("/public/..;/admin"), "/public/..%3B/admin");
        assert_eq!(literal("/public/..\\admin"), "/public/..%5Cadmin");
        assert_eq!(literal("/public/../admin"), "/public/../admin");
        assert_eq!(literal("/Public//A/"), "/public/a", "case, doubled and trailing slashes fold");
        assert_eq!(path("/public/..%2Fadmin"), "/admin");
    }

    #[test]
    fn patterns_fold_as_paths() {
        assert_eq!(pattern("/Admin/Login/", Pattern::Path), "/admin/login");
        assert_eq!(pattern("/API/", Pattern::Prefix), "/api/");
        assert_eq!(pattern("/API", Pattern::Prefix), "/api");
        assert_eq!(pattern("", Pattern::Prefix), "/");
        assert_eq!(pattern("/", Pattern::Prefix), "/");
        assert_eq!(pattern("/a/./", Pattern::Prefix), "/a/");
        assert_eq!(pattern("/Files/*/DOWNLOAD", Pattern::Glob), "/files/*/download");
        assert_eq!(pattern("**/Admin", Pattern::Glob), "**/admin", "a glob starts as written");
        assert_eq!(pattern("/api/**/", Pattern::Glob), "/api/**/");
        assert_eq!(pattern("/v?/x", Pattern::Glob), "/v?/x", "a glob's ? is its own");
    }

    /// The fast check agrees with the folding it skips, over every path up to 6 bytes of the
    /// bytes that matter.
    #[test]
    fn the_routed_check_agrees_with_the_folding() {
        let alphabet = [b'/', b'.', b'a', b'A', b'%', b';', b'\\', b'2', b'F'];
        let (mut paths, mut level) = (vec![Vec::new()], vec![Vec::new()]);
        for _ in 0..6 {
            level = level.iter().flat_map(|p| alphabet.iter().map(move |&b| [p.as_slice(), &[b]].concat())).collect();
            paths.extend(level.iter().cloned());
        }
        assert!(paths.len() > 500_000);
        for bytes in paths {
            let raw = std::str::from_utf8(&bytes).unwrap();
            let folded = fold(raw, ROUTED);
            assert_eq!(is_routed(&bytes), folded == raw, "{raw:?} folds to {folded:?}");
            assert_eq!(fold(&folded, ROUTED), folded, "{raw:?}");
            let literal = fold(raw, LITERAL);
            assert_eq!(fold(&literal, LITERAL), literal, "{raw:?}");
        }
    }
}
