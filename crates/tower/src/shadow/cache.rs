//! What a fake tells the caches on its way: a `Cache-Control` that no shared cache stores it
//! under (it is one client's: a CDN in front would answer it to every client) and that no cache
//! keeps it under past the ban, nor any field a cache in front obeys over it; and validators
//! that never match the real resource's (a cache that kept the fake and revalidated it would be
//! told by the upstream, 304, that it is still the real page).

use std::borrow::Cow;
use std::time::{Duration, SystemTime};

use http::HeaderValue;

/// Directives a fake's `Cache-Control` never has: a shared cache's own max-age, and those that
/// would let a cache show it past its `max-age` (never revalidated, or stale).
const NEVER_ON_A_FAKE: [&str; 4] = ["s-maxage", "immutable", "stale-while-revalidate", "stale-if-error"];

/// A fake's `Cache-Control` lines, made from the real ones (see [`FakeCacheControl::line`]).
pub(crate) struct FakeCacheControl {
    /// Whether the next line says `private` (the real ones keep shared caches away otherwise).
    add_private: bool,
    /// Whether the next line says `max-age` (the real ones give the fake no lifetime otherwise).
    add_max_age: bool,
    /// Longest a cache may keep the fake, in seconds: until the client is let through again.
    fresh_for: u64,
}

impl FakeCacheControl {
    /// For a fake of a response whose `Cache-Control` lines (those that are text) are `lines`,
    /// kept by a cache at most `fresh_for` seconds.
    pub(crate) fn new<'a>(lines: impl Iterator<Item = &'a str> + Clone, fresh_for: u64) -> Self {
        let says =
            |names: &[&str]| lines.clone().flat_map(directives).any(|d| names.iter().any(|n| directive_is(d, n)));
        // `no-cache` naming fields lets a cache reuse the rest without asking.
        let revalidated = lines.clone().flat_map(directives).any(|d| d.trim().eq_ignore_ascii_case("no-cache"));
        FakeCacheControl {
            add_private: !says(&["private", "public", "no-store"]),
            add_max_age: !says(&["max-age", "no-store"]) && !revalidated,
            fresh_for,
        }
    }

    /// The fake's line for a real `line`: `public`, and a `private` that names fields (which
    /// lets a shared cache store the rest), made a bare `private`; `max-age` at most
    /// `fresh_for`; [`NEVER_ON_A_FAKE`] dropped; every other directive as it was; and, on the first line, `private` and
    /// `max-age` when no real line says them. `None` if nothing is left of it.
    pub(crate) fn line(&mut self, line: &str) -> Option<String> {
        let mut out: Vec<Cow<'_, str>> = directives(line)
            .filter(|d| !d.trim().is_empty() && !NEVER_ON_A_FAKE.iter().any(|name| directive_is(d, name)))
            .map(|d| {
                let spacing = &d[..d.len() - d.trim_start().len()];
                if directive_is(d, "public") || directive_is(d, "private") {
                    Cow::Owned(format!("{spacing}private"))
                } else if directive_is(d, "max-age") {
                    let real = d.split_once('=').and_then(|(_, v)| v.trim().trim_matches('"').parse::<u64>().ok());
                    Cow::Owned(format!("{spacing}max-age={}", real.map_or(self.fresh_for, |r| r.min(self.fresh_for))))
                } else {
                    Cow::Borrowed(d)
                }
            })
            .collect();
        if std::mem::take(&mut self.add_private) {
            out.push(Cow::Borrowed(" private"));
        }
        if std::mem::take(&mut self.add_max_age) {
            out.push(Cow::Owned(format!(" max-age={}", self.fresh_for)));
        }
        let line = out.join(",").trim_start().to_string();
        (!line.is_empty()).then_some(line)
    }

    /// The fake's one line where the real responses had none (or none of text).
    pub(crate) fn alone(fresh_for: u64) -> String {
        format!("private, max-age={fresh_for}")
    }
}

/// The directives of a `Cache-Control` line, each with its spacing: split at the commas outside
/// quoted strings (`private="Set-Cookie, X-User"` is one).
fn directives(line: &str) -> impl Iterator<Item = &str> + Clone {
    let (mut quoted, mut escaped) = (false, false);
    line.split(move |c| {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            ',' if !quoted => return true,
            _ => {}
        }
        false
    })
}

/// Whether `directive` (with its spacing, and perhaps `=value`) is `name`.
fn directive_is(directive: &str, name: &str) -> bool {
    directive.split('=').next().is_some_and(|n| n.trim().eq_ignore_ascii_case(name))
}

/// Whether a field tells a cache in front how long to store a response, over `Cache-Control`:
/// the targeted fields (RFC 9213: `CDN-Cache-Control`, `Cloudflare-CDN-Cache-Control`…),
/// `Surrogate-Control`, nginx's `X-Accel-Expires`. Never on a fake; a cache in front reads them
/// and usually removes them.
pub(crate) fn for_caches_in_front(name: &str) -> bool {
    name == "cdn-cache-control"
        || name.ends_with("-cdn-cache-control")
        || name == "surrogate-control"
        || name == "x-accel-expires"
}

/// An HTTP date a second before `value`'s, as a fake's `Last-Modified` without an `ETag`: a
/// cache revalidating the fake with it (`If-Modified-Since`) is told the real resource was
/// modified since. `value` as it is if it is no date.
pub(crate) fn a_second_before(value: &HeaderValue) -> Option<HeaderValue> {
    let Some(date) = value.to_str().ok().and_then(|text| httpdate::parse_http_date(text).ok()) else {
        return Some(value.clone());
    };
    let before = date.checked_sub(Duration::from_secs(1))?;
    before.duration_since(SystemTime::UNIX_EPOCH).ok()?;
    HeaderValue::from_str(&httpdate::fmt_http_date(before)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake(real: &[&str], fresh_for: u64) -> Vec<String> {
        let mut made = FakeCacheControl::new(real.iter().copied(), fresh_for);
        real.iter().filter_map(|line| made.line(line)).collect()
    }

    #[test]
    fn a_fake_is_private_and_kept_no_longer_than_its_ban() {
        assert_eq!(fake(&["public, max-age=31536000, immutable"], 45), ["private, max-age=45"]);
        assert_eq!(fake(&["max-age=600, stale-while-revalidate=60, stale-if-error=600"], 45), ["max-age=45, private"]);
        assert_eq!(fake(&["max-age=10"], 45), ["max-age=10, private"], "a shorter lifetime kept");
        assert_eq!(fake(&["no-store"], 45), ["no-store"]);
        assert_eq!(fake(&["no-cache"], 45), ["no-cache, private"], "revalidated on every use");
        assert_eq!(fake(&["must-revalidate", "public, s-maxage=600"], 45), ["must-revalidate, max-age=45", "private"]);
        assert_eq!(fake(&["s-maxage=600", "max-age=\"60\""], 45), ["private", "max-age=45"]);
        assert_eq!(FakeCacheControl::alone(45), "private, max-age=45");
    }

    /// `private` naming fields (RFC 9111 section 5.2.2.7) lets a shared cache store the rest of
    /// the response: it is made a bare `private`.
    #[test]
    fn a_qualified_private_is_made_bare() {
        assert_eq!(fake(&["private=\"set-cookie\", max-age=600"], 45), ["private, max-age=45"]);
        assert_eq!(fake(&["max-age=60, PRIVATE=\"Set-Cookie, X-User\""], 45), ["max-age=45, private"]);
        assert_eq!(fake(&["no-cache=\"set-cookie\", public"], 45), ["no-cache=\"set-cookie\", private, max-age=45"]);
    }
}
