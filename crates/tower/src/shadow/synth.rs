//! Values a fake writes in place of a real response's: a random value shaped like a real one (a
//! request id, a session cookie's value), a date moved to now, and which header fields hold
//! such values. The randomness only has to look like an application's ids: a small
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

/// Words in a header name that say its value is one client's own: a session, a token, a key.
const PERSONAL: [&str; 10] =
    ["cookie", "token", "csrf", "xsrf", "session", "auth", "secret", "signature", "password", "nonce"];

/// Parts (between `-`) of a header name that say its value is new in every response: an id.
const UNIQUE: [&str; 16] = [
    "id",
    "requestid",
    "reqid",
    "traceid",
    "spanid",
    "correlationid",
    "uuid",
    "guid",
    "trace",
    "traceparent",
    "tracestate",
    "span",
    "ray",
    "etag",
    "correlation",
    "uid",
];

/// Whether the values of header `name` (lower case) are presumably one client's own or one
/// response's own, and so never replayed to another client as they are, until two clients were
/// seen to get the same value (`x-request-id`, `set-cookie`, `x-csrf-token`, `etag`, `cf-ray`).
pub(crate) fn per_client(name: &str) -> bool {
    PERSONAL.iter().any(|word| name.contains(word)) || name.split('-').any(|part| UNIQUE.contains(&part))
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
    fn ids_sessions_and_tokens_are_per_client() {
        for name in ["x-request-id", "set-cookie", "x-csrf-token", "etag", "cf-ray", "x-amzn-requestid", "traceparent"]
        {
            assert!(per_client(name), "{name}");
        }
        for name in ["server", "content-type", "cache-control", "x-app-version", "vary", "x-powered-by"] {
            assert!(!per_client(name), "{name}");
        }
    }
}
