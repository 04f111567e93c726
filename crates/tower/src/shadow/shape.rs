//! [`Shape`]: what a fake learns of a route's real responses: their header fields, each with
//! what was seen of its values (the same for two clients, or changing from one response to the
//! next), whether they said their length, and their latency (the last few, sampled). Bounded:
//! at most [`MAX_FIELDS`] fields and [`MAX_FIELD_BYTES`] of names and values, and
//! [`LATENCIES`] latencies.

use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use crate::shadow::synth::{self, SplitMix};

/// Most header fields a shape keeps (the fields after them are not learned).
pub(crate) const MAX_FIELDS: usize = 48;
/// Most bytes of names and values a shape keeps.
pub(crate) const MAX_FIELD_BYTES: usize = 4 << 10;
/// How many recent latencies a shape keeps.
pub(crate) const LATENCIES: usize = 16;

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

/// One header field of the last real response learned.
#[derive(Debug)]
struct Field {
    name: HeaderName,
    value: HeaderValue,
    /// The client the value was last sent to.
    client: IpAddr,
    /// Two different clients got this same value: it is nobody's own.
    shared: bool,
    /// Its value changed from one learned response to the next: it is per response.
    varies: bool,
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
    /// lines of that name).
    pub(crate) fn learn(&mut self, seen: &Seen<'_>, tick: u64) {
        let mut fields = Vec::with_capacity(seen.headers.len().min(MAX_FIELDS));
        let mut bytes = 0;
        for name in seen.headers.keys() {
            if HOP_BY_HOP.contains(&name.as_str()) {
                continue;
            }
            for (nth, value) in seen.headers.get_all(name).iter().enumerate() {
                bytes += name.as_str().len() + value.len();
                if fields.len() == MAX_FIELDS || bytes > MAX_FIELD_BYTES {
                    break;
                }
                let before = self.fields.iter().filter(|f| f.name == name).nth(nth);
                let (shared, varies) = match before {
                    Some(before) if before.value == value => {
                        (before.shared || before.client != seen.client, before.varies)
                    }
                    Some(_) => (false, true),
                    None => (false, false),
                };
                fields.push(Field { name: name.clone(), value: value.clone(), client: seen.client, shared, varies });
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

    /// Writes the learned fields into `headers` for a fake of `length` bytes of type
    /// `content_type`, at `now`: `Date` now, `Content-Length` the fake's, `Content-Type` the
    /// fake's; a value two clients were seen to get, as it is; a value that is presumably one
    /// client's or one response's own (a cookie, an id: see [`synth::per_client`]), or that
    /// changed between responses, made anew in its shape (a date moved as far from now as it was
    /// from the real response); any other as it is.
    pub(crate) fn write(
        &self,
        headers: &mut HeaderMap,
        length: usize,
        content_type: Option<&HeaderValue>,
        now: SystemTime,
        rng: &mut SplitMix,
    ) {
        for field in &self.fields {
            let name = &field.name;
            let value = if name == header::DATE {
                HeaderValue::from_str(&synth::date_now(now)).ok()
            } else if name == header::CONTENT_LENGTH {
                Some(HeaderValue::from(length))
            } else if name == header::CONTENT_TYPE {
                content_type.cloned()
            } else if field.shared && !field.varies {
                Some(field.value.clone())
            } else if name == header::SET_COOKIE {
                HeaderValue::from_bytes(&synth::cookie(field.value.as_bytes(), self.learned_at, now, rng)).ok()
            } else if field.varies || synth::per_client(name.as_str()) {
                self.anew(&field.value, now, rng)
            } else {
                Some(field.value.clone())
            };
            if let Some(value) = value {
                headers.append(field.name.clone(), value);
            }
        }
        if let Some(content_type) = content_type
            && !headers.contains_key(header::CONTENT_TYPE)
        {
            headers.insert(header::CONTENT_TYPE, content_type.clone());
        }
    }

    /// A value made anew in the shape of `value`: a date moved, anything else [`synth::same_shape`].
    fn anew(&self, value: &HeaderValue, now: SystemTime, rng: &mut SplitMix) -> Option<HeaderValue> {
        if let Some(date) = value.to_str().ok().and_then(|text| synth::date_moved(text, self.learned_at, now)) {
            return HeaderValue::from_str(&date).ok();
        }
        HeaderValue::from_bytes(&synth::same_shape(value.as_bytes(), rng)).ok()
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

    fn written(shape: &Shape) -> HeaderMap {
        let mut out = HeaderMap::new();
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_100);
        shape.write(&mut out, 5, Some(&HeaderValue::from_static("text/plain")), now, &mut SplitMix::seeded());
        out
    }

    #[test]
    fn a_value_is_replayed_once_two_clients_got_it_and_made_anew_once_it_changes() {
        let mut shape = Shape::new(0);
        shape.learn(&seen(&headers(&[("x-session-hint", "abc"), ("x-build", "b1")]), [192, 0, 2, 1]), 1);
        assert_ne!(written(&shape)["x-session-hint"], "abc", "one client's value is not replayed");
        assert_eq!(written(&shape)["x-build"], "b1");
        shape.learn(&seen(&headers(&[("x-session-hint", "abc"), ("x-build", "b2")]), [192, 0, 2, 2]), 2);
        assert_eq!(written(&shape)["x-session-hint"], "abc", "two clients got it: nobody's own");
        assert_ne!(written(&shape)["x-build"], "b2", "it changed: per response");
        assert_eq!(written(&shape)["x-build"].len(), 2);
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
        assert_eq!(out.len(), MAX_FIELDS + 1, "the fields kept and the fake's content type");
        assert!(!out.contains_key("connection"));
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
