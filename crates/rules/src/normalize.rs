//! What a path or query value means, not how it was spelled: so that `//login`, `/%6Cogin` and
//! `/x/../login` all count toward a rule on `/login`, and `?api_key=%61bc` and `?api_key=abc`
//! are one key.
//!
//! **Paths** (with `path_match = "exact"`, before matching and as the `path` characteristic):
//! - percent-encoded *unreserved* characters are decoded (`ALPHA DIGIT - . _ ~`, RFC 3986 §2.3:
//!   encoding them changes nothing for the server, so it must change nothing for the rules);
//!   other escapes stay as they are, uppercased (`%2f` → `%2F`: `/a%2Fb` is one segment, not two);
//! - repeated slashes become one;
//! - dot segments are removed (`/a/./b/../c` → `/a/c`, RFC 3986 §5.2.4; never above the root).
//!
//! Not normalised: case, a trailing slash (`/login/` is another path), `;` parameters, `\`. This
//! is the path of a rule with `path_match = "exact"`, for a backend on which those differences
//! name different resources; by default rules compare paths as applications route them, with
//! all of those folded (see `route`).
//!
//! **Query values** (the `query:NAME` characteristic) are fully percent-decoded and `+` is a
//! space (`application/x-www-form-urlencoded`); invalid escapes are kept as they are.

use std::borrow::Cow;

/// The path as the rules see it (see the module docs).
#[must_use]
pub fn path(raw: &str) -> Cow<'_, str> {
    let bytes = raw.as_bytes();
    if is_clean(bytes) {
        return Cow::Borrowed(raw);
    }
    // 1. Decode unreserved escapes, normalise the others to uppercase.
    let mut decoded = String::with_capacity(raw.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(byte) = hex_pair(bytes.get(i + 1..i + 3))
        {
            if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
                decoded.push(char::from(byte));
            } else {
                decoded.push('%');
                decoded.push(char::from(bytes[i + 1].to_ascii_uppercase()));
                decoded.push(char::from(bytes[i + 2].to_ascii_uppercase()));
            }
            i += 3;
            continue;
        }
        // Copy up to the next '%' in one piece (keeps multi-byte characters whole).
        let next = bytes[i + 1..].iter().position(|&b| b == b'%').map_or(bytes.len(), |p| i + 1 + p);
        decoded.push_str(&raw[i..next]);
        i = next;
    }
    // 2. Segments: drop empty ones (repeated slashes) and resolve dot segments.
    let mut segments: Vec<&str> = Vec::new();
    for segment in decoded.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            other => segments.push(other),
        }
    }
    let trailing = decoded.ends_with('/') || decoded.ends_with("/.") || decoded.ends_with("/..");
    let mut out = String::with_capacity(decoded.len());
    for segment in &segments {
        out.push('/');
        out.push_str(segment);
    }
    if out.is_empty() || (trailing && !segments.is_empty()) {
        out.push('/');
    }
    Cow::Owned(out)
}

/// A query value as the application sees it: percent-decoded, `+` as a space (see module docs),
/// as bytes (a decoded value need not be UTF-8).
#[must_use]
pub fn query_value(raw: &str) -> Cow<'_, [u8]> {
    if !raw.contains(['%', '+']) {
        return Cow::Borrowed(raw.as_bytes());
    }
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if hex_pair(bytes.get(i + 1..i + 3)).is_some() => {
                out.push(hex_pair(bytes.get(i + 1..i + 3)).unwrap_or(b'%'));
                i += 2;
            }
            byte => out.push(byte),
        }
        i += 1;
    }
    Cow::Owned(out)
}

fn hex_pair(pair: Option<&[u8]>) -> Option<u8> {
    let [high, low] = pair? else { return None };
    let digit = |b: u8| char::from(b).to_digit(16);
    Some(u8::try_from(digit(*high)? * 16 + digit(*low)?).unwrap_or(0))
}

/// Whether `path` needs nothing done: no escape, no doubled slash, no `.` or `..` segment (most
/// paths; one pass, as it runs on every request).
fn is_clean(path: &[u8]) -> bool {
    if path.is_empty() {
        return false;
    }
    for (i, &byte) in path.iter().enumerate() {
        match byte {
            b'%' => return false,
            b'/' if path.get(i + 1) == Some(&b'/') => return false,
            b'.' if i == 0 || path[i - 1] == b'/' => {
                let segment = path[i..].split(|&b| b == b'/').next().unwrap_or_default();
                if segment == b"." || segment == b".." {
                    return false;
                }
            }
            _ => {}
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_that_mean_login_are_login() {
        for spelled in
            ["/login", "//login", "/%6Cogin", "/%6cogin", "/x/../login", "/./login", "/a/b/../../login", "/../login"]
        {
            assert_eq!(path(spelled), "/login", "{spelled}");
        }
        assert_eq!(path("/login/"), "/login/", "a trailing slash is kept");
        assert_eq!(path("/a%2fb"), "/a%2Fb", "an encoded slash stays one segment");
        assert_eq!(path("/Login"), "/Login", "case matters");
        assert_eq!(path(""), "/");
        assert_eq!(path("/%"), "/%");
        assert_eq!(path("/caf%C3%A9/%7e"), "/caf%C3%A9/~");
        assert_eq!(path("/a/b/.."), "/a/");
        assert!(matches!(path("/plain/path"), Cow::Borrowed(_)));
    }

    #[test]
    fn the_clean_path_check_agrees_with_its_definition() {
        // Every path up to 7 bytes over the bytes that matter.
        let alphabet = [b'/', b'.', b'a', b'%'];
        let (mut paths, mut level) = (vec![Vec::new()], vec![Vec::new()]);
        for _ in 0..7 {
            level = level.iter().flat_map(|p| alphabet.iter().map(move |&b| [p.as_slice(), &[b]].concat())).collect();
            paths.extend(level.iter().cloned());
        }
        assert!(paths.len() > 20_000);
        for bytes in paths {
            let raw = std::str::from_utf8(&bytes).unwrap();
            let defined = !raw.is_empty()
                && !raw.contains('%')
                && !raw.contains("//")
                && !raw.split('/').any(|segment| segment == "." || segment == "..");
            assert_eq!(is_clean(&bytes), defined, "{raw:?}");
        }
    }

    #[test]
    fn query_values_are_decoded() {
        assert_eq!(query_value("%61bc"), b"abc".as_slice());
        assert_eq!(query_value("a+b%20c"), b"a b c".as_slice());
        assert_eq!(query_value("100%"), b"100%".as_slice());
        assert_eq!(query_value("%zz"), b"%zz".as_slice());
        assert_eq!(query_value("%FF"), b"\xff".as_slice(), "not UTF-8, kept as bytes");
        assert!(matches!(query_value("plain"), Cow::Borrowed(_)));
    }
}
