//! Values a fake writes in place of a real response's: a random value shaped like a real one (a
//! request id, a session cookie's value), only the changing tokens of a value made anew, a date
//! moved to now, and which header fields describe the server rather than the client. The randomness only has to look like an application's ids: a small
//! [`SplitMix`] generator, seeded once per process.

use std::hash::BuildHasher;
use std::time::{Duration, SystemTime};

/// splitmix64: fast, and good enough for values that only have to look random.
#[derive(Debug)]
pub(crate) struct SplitMix(u64);

impl SplitMix {
    /// Seeded from the process's random hasher keys.
    pub(crate) fn seeded() -> Self {
        SplitMix(std::collections::hash_map::RandomState::new().hash_one(0x5eed_u64))
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A uniform index below `n` (`n > 0`; the modulo bias is nothing at these sizes).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        #[allow(clippy::cast_possible_truncation)]
        let pick = (self.next() % n as u64) as usize;
        pick
    }

    fn pick(&mut self, alphabet: &[u8]) -> u8 {
        alphabet[self.below(alphabet.len())]
    }
}

const DIGITS: &[u8] = b"0123456789";
const LOWER: &[u8] = b"abcdefghijklmnopqrstuvwxyz";
const UPPER: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ";
const HEX_LOWER: &[u8] = b"0123456789abcdef";
const HEX_UPPER: &[u8] = b"0123456789ABCDEF";

/// A random value shaped like `value`: every letter and digit replaced by a random one of its
/// class, every other byte kept (an id's dashes, an ETag's quotes and `W/`, a value's length). A
/// hexadecimal value (letters `a-f` of one case, with digits) stays hexadecimal in that case:
/// its digits and letters are drawn from one alphabet, as a real hex id's are.
pub(crate) fn same_shape(value: &[u8], rng: &mut SplitMix) -> Vec<u8> {
    let (weak, rest) = match value.strip_prefix(b"W/") {
        Some(rest) => (&b"W/"[..], rest),
        None => (&b""[..], value),
    };
    let letters = || rest.iter().filter(|b| b.is_ascii_alphabetic());
    let hex = if letters().next().is_none() {
        None
    } else if letters().all(|b| (b'a'..=b'f').contains(b)) {
        Some(HEX_LOWER)
    } else if letters().all(|b| (b'A'..=b'F').contains(b)) {
        Some(HEX_UPPER)
    } else {
        None
    };
    let mut out = weak.to_vec();
    out.extend(rest.iter().map(|&b| match (b, hex) {
        (b'0'..=b'9' | b'a'..=b'z' | b'A'..=b'Z', Some(alphabet)) => rng.pick(alphabet),
        (b'0'..=b'9', None) => rng.pick(DIGITS),
        (b'a'..=b'z', None) => rng.pick(LOWER),
        (b'A'..=b'Z', None) => rng.pick(UPPER),
        (other, _) => other,
    }));
    out
}

/// A `Set-Cookie` value like `value`, for another client: the same cookie name and attributes,
/// a random value of the same shape, and an `Expires` as far from now as it was from
/// `learned_at`.
pub(crate) fn cookie(value: &[u8], learned_at: SystemTime, now: SystemTime, rng: &mut SplitMix) -> Vec<u8> {
    let (pair, attributes) = match value.iter().position(|&b| b == b';') {
        Some(at) => value.split_at(at),
        None => (value, &b""[..]),
    };
    let mut out = match pair.iter().position(|&b| b == b'=') {
        Some(at) => {
            let mut out = pair[..=at].to_vec();
            out.extend(same_shape(&pair[at + 1..], rng));
            out
        }
        // A cookie without `=` is a value alone (RFC 6265 section 5.2).
        None => same_shape(pair, rng),
    };
    // `attributes` starts with the `;` before the first one.
    for attribute in attributes.split(|&b| b == b';').skip(1) {
        out.push(b';');
        out.extend(expires_moved(attribute, learned_at, now).unwrap_or_else(|| attribute.to_vec()));
    }
    out
}

/// The name of the cookie a `Set-Cookie` value sets (all of its pair without `=`: RFC 6265
/// section 5.2 reads that as a value with an empty name).
pub(crate) fn cookie_name(set_cookie: &[u8]) -> &[u8] {
    let pair = set_cookie.split(|&b| b == b';').next().unwrap_or_default();
    match pair.iter().position(|&b| b == b'=') {
        Some(at) => pair[..at].trim_ascii(),
        None => b"",
    }
}

/// Whether a `Cookie` line names the cookie `name`.
pub(crate) fn names_cookie(line: &[u8], name: &[u8]) -> bool {
    line.split(|&b| b == b';').any(|pair| cookie_name(pair) == name)
}

/// An `Expires=DATE` attribute (with its spacing) with DATE moved by `now - learned_at`.
fn expires_moved(attribute: &[u8], learned_at: SystemTime, now: SystemTime) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(attribute).ok()?;
    let (name, date) = text.split_once('=')?;
    if !name.trim().eq_ignore_ascii_case("expires") {
        return None;
    }
    Some(format!("{name}={}", date_moved(date.trim(), learned_at, now)?).into_bytes())
}

/// An HTTP date as far from `now` as `value` was from `learned_at`; `None` if `value` is not one.
pub(crate) fn date_moved(value: &str, learned_at: SystemTime, now: SystemTime) -> Option<String> {
    let date = httpdate::parse_http_date(value).ok()?;
    let moved = match date.duration_since(learned_at) {
        Ok(ahead) => now.checked_add(ahead),
        Err(behind) => now.checked_sub(behind.duration()),
    }?;
    // `fmt_http_date` panics before 1970; such a date is not worth keeping.
    moved.duration_since(SystemTime::UNIX_EPOCH).ok()?;
    Some(httpdate::fmt_http_date(moved))
}

/// `now` as an HTTP date.
pub(crate) fn date_now(now: SystemTime) -> String {
    httpdate::fmt_http_date(now.max(SystemTime::UNIX_EPOCH + Duration::from_secs(1)))
}

/// Fields that describe the server or the resource, never the client: their values are replayed
/// from one client's response to another's (any other field's only once several clients got it).
const OF_THE_SERVER: [&str; 25] = [
    "server",
    "content-type",
    "content-language",
    "expires",
    "pragma",
    "vary",
    "age",
    "last-modified",
    "accept-ranges",
    "allow",
    "alt-svc",
    "via",
    "x-powered-by",
    "strict-transport-security",
    "content-security-policy",
    "content-security-policy-report-only",
    "x-frame-options",
    "x-content-type-options",
    "x-xss-protection",
    "referrer-policy",
    "permissions-policy",
    "cross-origin-opener-policy",
    "cross-origin-embedder-policy",
    "cross-origin-resource-policy",
    "x-dns-prefetch-control",
];

/// Whether header `name` (lower case) describes the server or the resource (see
/// [`OF_THE_SERVER`]).
pub(crate) fn of_the_server(name: &str) -> bool {
    OF_THE_SERVER.contains(&name)
}

/// The runs of letters and digits of `value` (its tokens), and whether `other` has the same
/// bytes between them: then the tokens that differ, as bits (a token past the 63rd: all).
pub(crate) fn differing_tokens(value: &[u8], other: &[u8]) -> u64 {
    let (a, b) = (tokens(value), tokens(other));
    if a.len() != b.len() || separators(value) != separators(other) {
        return u64::MAX;
    }
    let mut mask = 0;
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        if value[x.clone()] != other[y.clone()] {
            mask |= if i < 63 { 1 << i } else { u64::MAX };
        }
    }
    mask
}

/// `value` with the tokens of `mask` (see [`differing_tokens`]) made anew in their shape.
pub(crate) fn tokens_anew(value: &[u8], mask: u64, rng: &mut SplitMix) -> Vec<u8> {
    if mask == u64::MAX {
        return same_shape(value, rng);
    }
    let mut out = Vec::with_capacity(value.len());
    let mut at = 0;
    for (i, token) in tokens(value).into_iter().enumerate() {
        out.extend_from_slice(&value[at..token.start]);
        if i < 63 && mask & (1 << i) != 0 {
            out.extend(same_shape(&value[token.clone()], rng));
        } else {
            out.extend_from_slice(&value[token.clone()]);
        }
        at = token.end;
    }
    out.extend_from_slice(&value[at..]);
    out
}

fn tokens(value: &[u8]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, b) in value.iter().enumerate() {
        match (b.is_ascii_alphanumeric(), start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                out.push(s..i);
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push(s..value.len());
    }
    out
}

/// The bytes between the tokens, each token one 0 (two values with the same compare equal
/// whatever their tokens' lengths).
fn separators(value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(value.len());
    for b in value {
        if !b.is_ascii_alphanumeric() {
            out.push(*b);
        } else if out.last() != Some(&0) {
            out.push(0);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(value: &[u8]) -> Vec<u8> {
        value
            .iter()
            .map(|b| match b {
                b'0'..=b'9' => b'9',
                b'a'..=b'z' => b'a',
                b'A'..=b'Z' => b'A',
                other => *other,
            })
            .collect()
    }

    #[test]
    fn values_keep_their_shape_and_hex_stays_hex() {
        let mut rng = SplitMix::seeded();
        for value in [&b"req-4812-Xy"[..], b"12345", b"\"abc-XYZ\"", b"session"] {
            let made = same_shape(value, &mut rng);
            assert_eq!(shape(&made), shape(value), "{}", String::from_utf8_lossy(&made));
        }
        let hex = same_shape(b"W/\"0f3a9c\"", &mut rng);
        assert!(hex.starts_with(b"W/\"") && hex.len() == 10, "{}", String::from_utf8_lossy(&hex));
        assert!(hex[3..9].iter().all(|b| HEX_LOWER.contains(b)), "{}", String::from_utf8_lossy(&hex));
        let upper = same_shape(b"A0-FF", &mut rng);
        assert!(upper.iter().all(|b| HEX_UPPER.contains(b) || *b == b'-'), "{}", String::from_utf8_lossy(&upper));
        // Sixteen hex digits drawn twice are not the same.
        assert_ne!(same_shape(b"0123456789abcdef", &mut rng), same_shape(b"0123456789abcdef", &mut rng));
    }

    #[test]
    fn a_cookie_keeps_its_name_and_attributes_and_moves_its_expiry() {
        let mut rng = SplitMix::seeded();
        let learned = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let now = learned + Duration::from_secs(3_600);
        let real = format!("sid=abc123; Path=/; Expires={}; HttpOnly", httpdate::fmt_http_date(learned));
        let made = String::from_utf8(cookie(real.as_bytes(), learned, now, &mut rng)).unwrap();
        let expected = format!("; Path=/; Expires={}; HttpOnly", httpdate::fmt_http_date(now));
        assert!(made.starts_with("sid=") && made.ends_with(&expected), "{made}");
        assert_eq!(made.len(), real.len(), "{made}");
        assert_ne!(&made[..10], &real[..10]);
    }

    #[test]
    fn a_cookie_line_names_only_the_cookies_it_has() {
        assert_eq!(cookie_name(b"sid=abc; Path=/"), b"sid");
        assert_eq!(cookie_name(b" sid =abc"), b"sid");
        assert_eq!(cookie_name(b"abc; Path=/"), b"", "a value alone");
        assert!(names_cookie(b"theme=dark; sid=S1", b"sid"));
        assert!(!names_cookie(b"sid2=S1; xsid=S2; theme=sid", b"sid"));
    }

    #[test]
    fn only_the_tokens_that_change_are_made_anew() {
        let mut rng = SplitMix::seeded();
        let (one, two) = (
            &b"script-src 'nonce-4f2a9c'; object-src 'none'"[..],
            &b"script-src 'nonce-77b01e'; object-src 'none'"[..],
        );
        let mask = differing_tokens(one, two);
        assert_eq!(mask, 1 << 3, "the nonce alone (script, src, nonce, then it)");
        let made = String::from_utf8(tokens_anew(two, mask, &mut rng)).unwrap();
        assert!(made.starts_with("script-src 'nonce-") && made.ends_with("'; object-src 'none'"), "{made}");
        assert_ne!(made.as_bytes(), two);
        assert_eq!(differing_tokens(b"a-1", b"a.1"), u64::MAX, "another structure: all of it");
        assert_eq!(differing_tokens(b"v1.2", b"v1.20"), 1 << 1, "a token's length may change");
    }
}
