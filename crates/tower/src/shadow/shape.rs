//! [`Shape`]: what a fake learns of a route's real responses: their header fields, each with
//! what was seen of its values (the same for several clients, or changing from one response to the
//! next), whether they said their length, and their latency (the last few, sampled). Bounded:
//! at most [`MAX_FIELDS`] fields and [`MAX_FIELD_BYTES`] of names and values, and
//! [`LATENCIES`] latencies.

use std::net::{IpAddr, Ipv6Addr};
use std::time::{Duration, SystemTime};

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use smallvec::SmallVec;

use crate::shadow::cache::{self, FakeCacheControl};
use crate::shadow::synth::{self, SplitMix};

/// Most header fields a shape keeps (the fields after them are not learned).
pub(crate) const MAX_FIELDS: usize = 48;
/// Most bytes of names and values a shape keeps.
pub(crate) const MAX_FIELD_BYTES: usize = 4 << 10;
/// How many recent latencies a shape keeps.
pub(crate) const LATENCIES: usize = 16;
/// How many different clients in a row must get a value before it is taken for nobody's own
/// (one person on two addresses is two clients: three make that unlikely). An IPv6 client is its
/// /64 (see [`one_client`]).
pub(crate) const SHARED_BY: usize = 3;

/// Fields a response never carries to the client as they are: the connection's own
/// (hop-by-hop, RFC 9110 section 7.6.1), which the server writes itself.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "proxy-authenticate",
];

/// The client `address` stands for: an IPv6 address's /64 (a host's temporary addresses are
/// one client, as the `client_ip` key and the proxy's connection cap read them), an IPv4-mapped
/// one as IPv4.
fn one_client(address: IpAddr) -> IpAddr {
    match address.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !u128::from(u64::MAX))),
        v4 => v4,
    }
}

/// Fields that describe the real body, which a fake's (the rule's, as it is) is not: its coding
/// (a client would fail to decode the fake), its digests and its range.
const OF_THE_REAL_BODY: [&str; 6] =
    ["content-encoding", "content-range", "content-md5", "digest", "content-digest", "repr-digest"];

/// Whether a field of a real response is learned: not the connection's own, nor the real body's,
/// nor one that tells a cache in front how long to store it (see [`cache::for_caches_in_front`]).
fn learned(name: &HeaderName) -> bool {
    let name = name.as_str();
    !HOP_BY_HOP.contains(&name) && !OF_THE_REAL_BODY.contains(&name) && !cache::for_caches_in_front(name)
}

/// One header field of the last real response learned.
#[derive(Debug)]
struct Field {
    name: HeaderName,
    value: HeaderValue,
    /// The different clients that got this value in a row (up to [`SHARED_BY`]: then it is
    /// nobody's own); once it changed (in the same structure), those that got its tokens that
    /// never changed.
    clients: SmallVec<[IpAddr; SHARED_BY]>,
    /// The tokens of its value (runs of letters and digits) seen to change from one learned
    /// response to the next, as bits (all: the value itself changed shape): per response.
    changing: u64,
}

/// What was learned of one route's (or rule's) real responses.
#[derive(Debug)]
pub(crate) struct Shape {
    /// The last response's fields, in its order.
    fields: Vec<Field>,
    /// Whether it gave its length (else it was sent chunked).
    sized: bool,
    /// When it was learned (wall clock: what dates in it are relative to).
    learned_at: SystemTime,
    /// Recent latencies (time to the response head), in microseconds; the first `count` used.
    latencies: [u32; LATENCIES],
    count: usize,
    next: usize,
    /// When it was last learned, in the owner's ticks (the least recently learned is evicted).
    pub(crate) tick: u64,
}

/// What a fake is written for.
pub(crate) struct FakeFor<'a> {
    /// The length of its body.
    pub(crate) length: usize,
    pub(crate) content_type: Option<&'a HeaderValue>,
    /// Whether the shape was learned on the request's host (else no value is replayed for having
    /// been shared: it is another site's).
    pub(crate) this_host: bool,
    /// The request's `Cookie` lines.
    pub(crate) cookies: &'a [&'a HeaderValue],
    /// Longest a cache may keep the fake, in seconds: until the client is let through again.
    pub(crate) fresh_for: u64,
}

/// A real response as it is learned.
pub(crate) struct Seen<'r> {
    pub(crate) headers: &'r HeaderMap,
    pub(crate) sized: bool,
    pub(crate) client: IpAddr,
    pub(crate) latency: Duration,
    pub(crate) at: SystemTime,
}

impl Shape {
    pub(crate) fn new(tick: u64) -> Self {
        Shape {
            fields: Vec::new(),
            sized: true,
            learned_at: SystemTime::UNIX_EPOCH,
            latencies: [0; LATENCIES],
            count: 0,
            next: 0,
            tick,
        }
    }

    /// Learns `seen`: its fields replace the last response's, each keeping what was seen of its
    /// values when the last response had it too (the same name, the same position among the
    /// lines of that name). A value's clients go on while its structure stays (its tokens that
    /// never changed are then those every one of them got); a value of another structure starts
    /// them anew.
    pub(crate) fn learn(&mut self, seen: &Seen<'_>, tick: u64) {
        let client = one_client(seen.client);
        let mut fields = Vec::with_capacity(seen.headers.len().min(MAX_FIELDS));
        let mut bytes = 0;
        for name in seen.headers.keys().filter(|name| learned(name)) {
            for (nth, value) in seen.headers.get_all(name).iter().enumerate() {
                bytes += name.as_str().len() + value.len();
                if fields.len() == MAX_FIELDS || bytes > MAX_FIELD_BYTES {
                    break;
                }
                // A copy: a value hyper read is a slice of its connection's read buffer (up to
                // 400 KiB), which a shared one would keep for as long as the shape.
                let Ok(value) = HeaderValue::from_bytes(value.as_bytes()) else { continue };
                let before = self.fields.iter().filter(|f| f.name == name).nth(nth);
                let mut clients = SmallVec::new();
                let changing = match before {
                    Some(before) => {
                        let changing = if before.value == value {
                            before.changing
                        } else {
                            before.changing | synth::differing_tokens(before.value.as_bytes(), value.as_bytes())
                        };
                        // Its tokens that never changed were got by every client so far.
                        if changing != u64::MAX {
                            clients.clone_from(&before.clients);
                        }
                        changing
                    }
                    None => 0,
                };
                if clients.len() < SHARED_BY && !clients.contains(&client) {
                    clients.push(client);
                }
                fields.push(Field { name: name.clone(), value, clients, changing });
            }
        }
        self.fields = fields;
        self.sized = seen.sized;
        self.learned_at = seen.at;
        let micros = u32::try_from(seen.latency.as_micros()).unwrap_or(u32::MAX);
        self.latencies[self.next] = micros;
        self.next = (self.next + 1) % LATENCIES;
        self.count = (self.count + 1).min(LATENCIES);
        self.tick = tick;
    }

    /// One of the recent latencies, at random.
    pub(crate) fn latency(&self, rng: &mut SplitMix) -> Option<Duration> {
        (self.count > 0).then(|| Duration::from_micros(u64::from(self.latencies[rng.below(self.count)])))
    }

    /// Whether the real responses gave their length.
    pub(crate) fn sized(&self) -> bool {
        self.sized
    }

    /// Writes the learned fields into `headers` for `fake`, at `now`: `Date` now,
    /// `Content-Length` and `Content-Type` the fake's; a `Cache-Control` under which no shared
    /// cache stores the fake, nor any cache past the ban ([`FakeCacheControl`]), always; validators
    /// that never match the real resource's (a cache that kept the fake would go on showing it
    /// after the ban, the upstream answering 304): an `ETag` of its own, always, and without one,
    /// `Last-Modified` a second earlier; a `Set-Cookie` with a value of its own
    /// ([`synth::cookie`]), unless the client sent a cookie of that name (it would replace it); a
    /// value that changed between responses with its changing tokens made anew (a date moved as
    /// far from now as it was), its others kept once [`SHARED_BY`] clients in a row got them
    /// (else made anew too); a value [`SHARED_BY`] clients in a row got (on this host), or of a
    /// field that describes the server ([`synth::of_the_server`]), as it is; any other made anew
    /// in its shape (it may be one client's own).
    pub(crate) fn write(&self, headers: &mut HeaderMap, fake: &FakeFor<'_>, now: SystemTime, rng: &mut SplitMix) {
        let FakeFor { length, content_type, this_host, fresh_for, .. } = *fake;
        let lines =
            self.fields.iter().filter(|f| f.name == header::CACHE_CONTROL).filter_map(|f| f.value.to_str().ok());
        let mut cache_control = FakeCacheControl::new(lines, fresh_for);
        let shared = |field: &Field| this_host && field.clients.len() >= SHARED_BY;
        // A cache revalidates with the `ETag` if there is one, else with `Last-Modified`.
        let tagged = self.fields.iter().any(|f| f.name == header::ETAG);
        for field in &self.fields {
            let (name, real) = (&field.name, field.value.as_bytes());
            let value = if name == header::DATE {
                HeaderValue::from_str(&synth::date_now(now)).ok()
            } else if name == header::CONTENT_LENGTH {
                Some(HeaderValue::from(length))
            } else if name == header::CONTENT_TYPE {
                content_type.cloned()
            } else if name == header::CACHE_CONTROL {
                let line = field.value.to_str().ok().and_then(|line| cache_control.line(line));
                line.and_then(|line| HeaderValue::from_str(&line).ok())
            } else if name == header::SET_COOKIE {
                let sent =
                    fake.cookies.iter().any(|line| synth::names_cookie(line.as_bytes(), synth::cookie_name(real)));
                (!sent).then(|| HeaderValue::from_bytes(&synth::cookie(real, self.learned_at, now, rng)).ok()).flatten()
            } else if name == header::ETAG {
                HeaderValue::from_bytes(&synth::same_shape(real, rng)).ok()
            } else if shared(field) && field.changing == 0 {
                Some(field.value.clone())
            } else if field.changing != 0 {
                let steady = shared(field) || synth::of_the_server(name.as_str());
                match field.value.to_str().ok().and_then(|text| synth::date_moved(text, self.learned_at, now)) {
                    Some(date) => HeaderValue::from_str(&date).ok(),
                    None if steady => HeaderValue::from_bytes(&synth::tokens_anew(real, field.changing, rng)).ok(),
                    // Its steady tokens too may be one client's own.
                    None => HeaderValue::from_bytes(&synth::same_shape(real, rng)).ok(),
                }
            } else if synth::of_the_server(name.as_str()) {
                Some(field.value.clone())
            } else {
                HeaderValue::from_bytes(&synth::same_shape(real, rng)).ok()
            };
            let value = match value {
                Some(date) if name == header::LAST_MODIFIED && !tagged => cache::a_second_before(&date),
                value => value,
            };
            if let Some(value) = value {
                headers.append(name.clone(), value);
            }
        }
        if !headers.contains_key(header::CACHE_CONTROL)
            && let Ok(line) = HeaderValue::from_str(&FakeCacheControl::alone(fresh_for))
        {
            headers.insert(header::CACHE_CONTROL, line);
        }
        if let Some(content_type) = content_type
            && !headers.contains_key(header::CONTENT_TYPE)
        {
            headers.insert(header::CONTENT_TYPE, content_type.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen<'h>(headers: &'h HeaderMap, client: [u8; 4]) -> Seen<'h> {
        Seen {
            headers,
            sized: true,
            client: IpAddr::from(client),
            latency: Duration::from_millis(200),
            at: SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
        }
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    fn names(headers: &HeaderMap) -> Vec<&str> {
        headers.keys().map(HeaderName::as_str).collect()
    }

    fn written(shape: &Shape) -> HeaderMap {
        let mut out = HeaderMap::new();
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_100);
        let text = HeaderValue::from_static("text/plain");
        let fake = FakeFor { length: 5, content_type: Some(&text), this_host: true, cookies: &[], fresh_for: 45 };
        shape.write(&mut out, &fake, now, &mut SplitMix::seeded());
        out
    }

    #[test]
    fn a_value_is_replayed_once_three_clients_in_a_row_got_it_and_never_once_it_changed() {
        let mut shape = Shape::new(0);
        let first = [("server", "nginx"), ("x-user", "alice@example.com"), ("x-build", "b1-7000001")];
        shape.learn(&seen(&headers(&first), [192, 0, 2, 1]), 1);
        let out = written(&shape);
        assert_eq!(out["server"], "nginx", "it describes the server");
        assert_ne!(out["x-user"], "alice@example.com", "one client's value is never another's");
        assert_eq!(out["x-user"].len(), "alice@example.com".len());
        let second = [("server", "nginx"), ("x-user", "alice@example.com"), ("x-build", "b1-8000002")];
        shape.learn(&seen(&headers(&second), [192, 0, 2, 2]), 2);
        assert_ne!(written(&shape)["x-user"], "alice@example.com", "one person may have two addresses");
        shape.learn(&seen(&headers(&second), [192, 0, 2, 2]), 3);
        assert_ne!(written(&shape)["x-user"], "alice@example.com", "the same client twice is one");
        shape.learn(&seen(&headers(&second), [192, 0, 2, 3]), 4);
        let out = written(&shape);
        assert_eq!(out["x-user"], "alice@example.com", "three clients in a row got it: nobody's own");
        let build = out["x-build"].to_str().unwrap();
        assert!(build.starts_with("b1-") && build.len() == 10, "only the changing token is made anew: {build}");
        // A value that changed is never replayed, whoever gets it next.
        for client in 4..8 {
            shape.learn(&seen(&headers(&second), [192, 0, 2, client]), u64::from(client) + 1);
        }
        assert_ne!(written(&shape)["x-build"], "b1-8000002");
    }

    #[test]
    fn a_cookie_is_never_replayed() {
        let mut shape = Shape::new(0);
        for client in 1..=5 {
            shape.learn(&seen(&headers(&[("set-cookie", "consent=yes123; Path=/")]), [192, 0, 2, client]), 1);
        }
        let cookie = written(&shape)["set-cookie"].to_str().unwrap().to_string();
        assert!(cookie.starts_with("consent=") && cookie.ends_with("; Path=/"), "{cookie}");
        assert_ne!(cookie, "consent=yes123; Path=/");
    }

    #[test]
    fn fields_are_bounded_and_hop_by_hop_ones_never_learned() {
        let mut many = HeaderMap::new();
        many.insert("connection", HeaderValue::from_static("close"));
        for i in 0..100 {
            many.insert(HeaderName::from_bytes(format!("x-field-{i}").as_bytes()).unwrap(), HeaderValue::from(i));
        }
        let mut shape = Shape::new(0);
        shape.learn(&seen(&many, [192, 0, 2, 1]), 1);
        let out = written(&shape);
        assert_eq!(out.len(), MAX_FIELDS + 2, "the fields kept, and the fake's cache control and content type");
        assert!(!out.contains_key("connection"));
    }

    /// A header value read by hyper is a slice of the connection's read buffer (up to 400 KiB
    /// after a large body): a shape keeping it kept the whole buffer, 576 shapes ~230 MB.
    #[test]
    fn a_learned_value_holds_its_own_bytes_not_the_buffer_it_was_read_into() {
        struct Buffer {
            _alive: std::sync::Arc<()>,
            read: Vec<u8>,
        }
        impl AsRef<[u8]> for Buffer {
            fn as_ref(&self) -> &[u8] {
                &self.read
            }
        }
        let alive = std::sync::Arc::new(());
        let mut read = b"shop".to_vec();
        read.resize(64 << 10, b'x');
        let buffer = bytes::Bytes::from_owner(Buffer { _alive: alive.clone(), read });
        let mut real = HeaderMap::new();
        real.insert("x-app", HeaderValue::from_maybe_shared(buffer.slice(..4)).unwrap());
        drop(buffer);
        let mut shape = Shape::new(0);
        shape.learn(&seen(&real, [192, 0, 2, 1]), 1);
        drop(real);
        assert_eq!(
            std::sync::Arc::strong_count(&alive),
            1,
            "the shape keeps the 64 KiB buffer the value was read into"
        );
    }

    /// The fake's body is the rule's, as it is: a field describing the encoding or the digest of
    /// the real body would make a client fail to read it. Before: `Content-Encoding: gzip` on a
    /// plain body (a browser's `ERR_CONTENT_DECODING_FAILED`), and the real body's digests.
    #[test]
    fn a_fake_carries_nothing_that_describes_the_real_body() {
        let mut shape = Shape::new(0);
        let real = headers(&[
            ("content-encoding", "gzip"),
            ("content-digest", "sha-256=:RK/0qy18MlBSVnWgjwz6lZEWjP/lF5HF9bvEF8FabDg=:"),
            ("content-md5", "Q2hlY2sgSW50ZWdyaXR5IQ=="),
            ("vary", "Accept-Encoding"),
        ]);
        for client in 1..=3 {
            shape.learn(&seen(&real, [192, 0, 2, client]), u64::from(client));
        }
        assert_eq!(names(&written(&shape)), ["vary", "cache-control", "content-type"], "{:?}", written(&shape));
    }

    /// A fake is one client's: a cache in front (a CDN) that stored it would serve it to every
    /// client of the route. Before: `Cache-Control: public, max-age=600` as the real responses',
    /// and the CDN's own fields, which it obeys over `Cache-Control`.
    #[test]
    fn a_fake_is_never_stored_by_a_shared_cache() {
        let mut shape = Shape::new(0);
        let real = headers(&[
            ("cache-control", "public, max-age=600, s-maxage=3600"),
            ("cdn-cache-control", "max-age=600"),
            ("cloudflare-cdn-cache-control", "max-age=600"),
            ("surrogate-control", "max-age=600"),
            ("x-accel-expires", "600"),
            ("last-modified", "Tue, 14 Nov 2023 22:13:20 GMT"),
        ]);
        for client in 1..=3 {
            shape.learn(&seen(&real, [192, 0, 2, client]), u64::from(client));
        }
        let out = written(&shape);
        assert_eq!(out["cache-control"], "private, max-age=45", "{out:?}");
        assert_eq!(names(&out), ["cache-control", "last-modified", "content-type"], "{out:?}");
        let mut bare = Shape::new(0);
        bare.learn(&seen(&headers(&[("last-modified", "Tue, 14 Nov 2023 22:13:20 GMT")]), [192, 0, 2, 1]), 1);
        assert_eq!(written(&bare)["cache-control"], "private, max-age=45", "heuristically cacheable: made private");
        let mut kept = Shape::new(0);
        kept.learn(&seen(&headers(&[("cache-control", "no-store")]), [192, 0, 2, 1]), 1);
        assert_eq!(written(&kept)["cache-control"], "no-store");
    }

    /// Before: `user=alice;req=…` from alice alone, twice, was written with `alice` as it was
    /// (only the changing `req` token made anew), to any client.
    #[test]
    fn the_steady_part_of_a_changing_value_is_replayed_only_once_three_clients_got_it() {
        let mut shape = Shape::new(0);
        for req in 1..=2 {
            let real = headers(&[("x-trace", &format!("user=alice;req={req}"))]);
            shape.learn(&seen(&real, [192, 0, 2, 1]), req);
        }
        let out = written(&shape);
        let trace = out["x-trace"].to_str().unwrap();
        assert!(!trace.contains("alice"), "one client's token shown to another: {trace}");
        assert_eq!(trace.len(), "user=alice;req=2".len(), "{trace}");
        let mut shape = Shape::new(0);
        for client in 1..=3 {
            let real = headers(&[("x-trace", &format!("app=shop;req={client}"))]);
            shape.learn(&seen(&real, [192, 0, 2, client]), u64::from(client));
            let out = written(&shape);
            let trace = out["x-trace"].to_str().unwrap();
            assert_eq!(trace.starts_with("app=shop;req="), client == 3, "after {client} clients: {trace}");
        }
    }

    /// An IPv6 host's addresses are one client (its /64, as the `client_ip` key and the
    /// proxy's connection cap read it), and so is an IPv4 client seen as IPv4-mapped IPv6.
    /// Before: one host's three temporary addresses (or an IPv4 client seen both ways) made its
    /// own value nobody's.
    #[test]
    fn one_hosts_addresses_are_one_client() {
        for addresses in [
            ["2001:db8:1:2::1", "2001:db8:1:2::2", "2001:db8:1:2:aaaa::3"],
            ["192.0.2.1", "::ffff:192.0.2.1", "2001:db8:1:2::1"],
        ] {
            let mut shape = Shape::new(0);
            let real = headers(&[("x-user", "alice@example.com")]);
            for (tick, address) in (1..).zip(addresses) {
                shape.learn(&Seen { client: address.parse().unwrap(), ..seen(&real, [0; 4]) }, tick);
            }
            assert_ne!(
                written(&shape)["x-user"],
                "alice@example.com",
                "{addresses:?}: one host's value shown to another"
            );
        }
    }

    /// A fake a client's cache keeps must not be revalidated as the real resource once the ban
    /// ends (the upstream would answer 304, and the cache go on showing the fake): its `ETag` is
    /// always its own, and without one its `Last-Modified` is a second before the real one's.
    /// Before: the real `ETag` (three clients got it) and `Last-Modified`, as they were.
    #[test]
    fn a_fakes_validators_never_validate_the_real_resource() {
        let modified = "Tue, 14 Nov 2023 22:13:20 GMT";
        let mut tagged = Shape::new(0);
        let mut dated = Shape::new(0);
        for client in 1..=3 {
            let real = headers(&[("etag", "W/\"9bc04e77370bcf3e\""), ("last-modified", modified)]);
            tagged.learn(&seen(&real, [192, 0, 2, client]), u64::from(client));
            dated.learn(&seen(&headers(&[("last-modified", modified)]), [192, 0, 2, client]), u64::from(client));
        }
        let out = written(&tagged);
        let etag = out["etag"].to_str().unwrap();
        assert!(etag != "W/\"9bc04e77370bcf3e\"" && etag.starts_with("W/\"") && etag.len() == 20, "{etag}");
        assert_eq!(out["last-modified"], modified, "the ETag is what a cache revalidates with");
        assert_eq!(written(&dated)["last-modified"], "Tue, 14 Nov 2023 22:13:19 GMT");
    }

    #[test]
    fn dates_are_now_and_lengths_the_fakes() {
        let mut shape = Shape::new(0);
        let real = headers(&[("date", "Tue, 14 Nov 2023 22:13:20 GMT"), ("content-length", "900")]);
        shape.learn(&seen(&real, [192, 0, 2, 1]), 1);
        let out = written(&shape);
        assert_eq!(out["date"], "Tue, 14 Nov 2023 22:15:00 GMT");
        assert_eq!(out["content-length"], "5");
    }
}
