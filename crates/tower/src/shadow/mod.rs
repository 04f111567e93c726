//! A shadow-ban's fake success, shaped like the real responses of the route it stands in for.
//!
//! The engine never sees responses, so the middleware learns them: a request let through that a
//! `shadow-ban` rule's `mitigation.match` selects has its response learned when its status is the
//! one the rule fakes: its header fields and its latency (the time the service took to the
//! response head), per rule, per rule and host and per route (the rule, the host, the method and
//! the path as the rule reads it): one upstream's sites (a tenant's subdomain) never show each
//! other's values. Bounded: 512 routes, 64 rules and hosts and 64 rules (the least recently
//! learned evicted), each keeping its last response's first 48 fields (4 KiB of names and
//! values) and its last 16 latencies.
//!
//! A fake then carries the fields of its route's last real response (else its rule's on its
//! host, else its rule's on any host, with no value replayed for having been shared): `Date`
//! now, `Content-Length` and `Content-Type` the fake's, a `Cache-Control` no shared cache stores
//! it under (it is one client's) nor any cache past the ban, validators of its own, nothing of
//! the real body's encoding or digest, a value that changed between responses with its changing
//! tokens made anew, a `Set-Cookie` with a value of its own (none for a cookie the client sent),
//! a value three clients in a row were seen to get or of a field describing the server as it
//! is, any other (it may be one client's own) made anew in its shape: one client's value is
//! never shown to another. Chunked if the real responses were. It waits one of the shape's
//! recent latencies, picked at random (at most 30 s), before it is answered; at most
//! [`Options::shadow_ban_max_waiting`](crate::Options::shadow_ban_max_waiting) fakes wait at
//! once, the others are answered at once. With `headers_on_allowed` it carries the `RateLimit`
//! fields an allowed response would: remaining 0. Counted in
//! `tollgate_shadow_ban_fakes_total{rule, delay}` (`learned`, `none_learned`, `over_cap`) and
//! `tollgate_shadow_ban_waiting`.
//!
//! Learning takes the table's lock only if it is free (a response is a sample; a busy table
//! skips it), so responses never wait on each other for it.

mod cache;
mod shape;
mod synth;

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher, RandomState};
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, TryLockError};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use axum_core::body::Body;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode, header};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use smallvec::SmallVec;
use tokio::time::Instant;
use tollgate_core::Decision;
use tollgate_edge as edge;
use tollgate_engine::{Fields, Policy};
use tollgate_rules::Action;
use tollgate_rules::route::RequestPath;

use self::cache::FakeCacheControl;
use self::shape::{FakeFor, Seen, Shape};
use self::synth::SplitMix;
use crate::options::Options;

/// Most routes whose real responses are learned (over every rule).
pub(crate) const MAX_ROUTE_SHAPES: usize = 512;
/// Most rules whose real responses are learned on any host (a reload may rename them all), and
/// most rules and hosts.
pub(crate) const MAX_RULE_SHAPES: usize = 64;
/// Longest a fake waits, whatever the route's latency.
pub(crate) const MAX_FAKE_DELAY: Duration = Duration::from_secs(30);
/// Most fakes waiting at once, by default ([`Options::shadow_ban_max_waiting`]).
pub const DEFAULT_MAX_WAITING: usize = 1024;

/// The learned shapes and the fakes waiting, shared by a layer's services.
#[derive(Debug)]
pub(crate) struct Shadow {
    shapes: Mutex<Shapes>,
    /// Keys the tables (seeded per process: a client cannot aim at one slot).
    keys: RandomState,
    max_waiting: usize,
    waiting: AtomicUsize,
    metrics: Metrics,
}

#[derive(Debug)]
struct Shapes {
    /// By rule and status, on any host: for a host not learned yet (its values not replayed).
    rules: HashMap<u64, Shape>,
    /// By rule, status and host: for a route not learned yet.
    hosts: HashMap<u64, Shape>,
    /// By rule, status, host, method and path.
    routes: HashMap<u64, Shape>,
    /// Counts learnings (orders the shapes for eviction).
    tick: u64,
    rng: SplitMix,
}

impl Shapes {
    /// Learns `seen` into the shapes of `target`'s rule, its host and its route.
    fn learn(&mut self, target: &Target, seen: &Seen<'_>) {
        self.tick += 1;
        let tick = self.tick;
        for (table, key, most) in [
            (&mut self.rules, target.rule, MAX_RULE_SHAPES),
            (&mut self.hosts, target.host, MAX_RULE_SHAPES),
            (&mut self.routes, target.route, MAX_ROUTE_SHAPES),
        ] {
            if !table.contains_key(&key)
                && table.len() >= most
                && let Some(oldest) = table.iter().min_by_key(|(_, shape)| shape.tick).map(|(key, _)| *key)
            {
                table.remove(&oldest);
            }
            table.entry(key).or_insert_with(|| Shape::new(tick)).learn(seen, tick);
        }
    }
}

/// Where a real response is learned.
#[derive(Debug)]
struct Target {
    rule: u64,
    host: u64,
    route: u64,
    status: u16,
}

/// A request let through whose response a shadow-ban rule learns (see [`Shadow::learning`]).
#[derive(Debug)]
pub(crate) struct Learning {
    shadow: Arc<Shadow>,
    targets: SmallVec<[Target; 2]>,
    client: IpAddr,
    started: Instant,
}

impl Learning {
    /// Starts the latency's clock (the request is passed on now).
    pub(crate) fn start(&mut self) {
        self.started = Instant::now();
    }

    /// Learns the response (its head: `status`, `headers`, whether its body gave its length) for
    /// the rules that fake that status.
    pub(crate) fn record(&self, status: StatusCode, headers: &HeaderMap, sized: bool) {
        let status = status.as_u16();
        if !self.targets.iter().any(|t| t.status == status) {
            return;
        }
        let seen = Seen { headers, sized, client: self.client, latency: self.started.elapsed(), at: SystemTime::now() };
        let mut shapes = match self.shadow.shapes.try_lock() {
            Ok(shapes) => shapes,
            Err(TryLockError::WouldBlock) => return,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
        };
        for target in self.targets.iter().filter(|t| t.status == status) {
            shapes.learn(target, &seen);
        }
    }
}

/// A fake, and how it waits.
pub(crate) struct Fake {
    pub(crate) response: Response<Body>,
    /// None: answered at once.
    pub(crate) wait: Option<Wait>,
}

/// A fake's wait, holding one of the places for waiting fakes until it ends (or is dropped).
#[derive(Debug)]
pub(crate) struct Wait {
    delay: Duration,
    _place: Place,
}

impl Wait {
    pub(crate) async fn elapse(self) {
        tokio::time::sleep(self.delay).await;
    }
}

#[derive(Debug)]
struct Place(Arc<Shadow>);

impl Drop for Place {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::AcqRel);
        self.0.metrics.waiting.dec();
    }
}

/// What a shadow-ban rule answers (the engine's `Answer::ShadowBan`).
pub(crate) struct Ban {
    pub(crate) status: u16,
    pub(crate) body: String,
    pub(crate) content_type: String,
    pub(crate) fields: Box<Fields>,
}

impl Shadow {
    pub(crate) fn new(max_waiting: usize) -> Self {
        Shadow {
            shapes: Mutex::new(Shapes {
                rules: HashMap::new(),
                hosts: HashMap::new(),
                routes: HashMap::new(),
                tick: 0,
                rng: SplitMix::seeded(),
            }),
            keys: RandomState::new(),
            max_waiting,
            waiting: AtomicUsize::new(0),
            metrics: Metrics::default(),
        }
    }

    /// Registers the fakes' metrics in `registry` (whose prefix they take).
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "shadow_ban_fakes",
            "Shadow-ban fakes by rule and wait: learned (waited a latency of the route), none_learned \
             (no real response learned yet: at once), over_cap (too many waiting: at once)",
            self.metrics.fakes.clone(),
        );
        registry.register("shadow_ban_waiting", "Shadow-ban fakes waiting now", self.metrics.waiting.clone());
    }

    fn rule_key(&self, rule: &str, status: u16) -> u64 {
        self.keys.hash_one((rule, status))
    }

    fn host_key(&self, rule: &str, status: u16, host: &str) -> u64 {
        self.keys.hash_one((rule, status, HostKey(host)))
    }

    fn route_key(&self, rule: &str, status: u16, host: &str, method: &str, path: &str) -> u64 {
        self.keys.hash_one((rule, status, HostKey(host), method, path))
    }

    /// What `request` to `host` (see [`host_of`]; read only if a rule learns), let through,
    /// teaches the shadow-ban rules whose `mitigation.match` selects it: `None` if there are none
    /// (no rule shadow-bans, as in most policies).
    pub(crate) fn learning<'h>(
        self: &Arc<Self>,
        policy: &Policy,
        request: &tollgate_rules::Request<'_>,
        host: impl FnOnce() -> &'h str,
    ) -> Option<Box<Learning>> {
        let mut targets = SmallVec::new();
        let mut path = None;
        let mut host = Some(host);
        let mut read: &str = "";
        for rule in &policy.rules.rules {
            let Action::ShadowBan { status, .. } = &rule.action else { continue };
            let path = path.get_or_insert_with(|| RequestPath::new(request.path));
            if rule.mitigation_matcher.matches(request, path, rule.path_match) {
                if let Some(host) = host.take() {
                    read = host();
                }
                let host = read;
                targets.push(Target {
                    rule: self.rule_key(&rule.name, *status),
                    host: self.host_key(&rule.name, *status, host),
                    route: self.route_key(&rule.name, *status, host, request.method, path.key(rule.path_match)),
                    status: *status,
                });
            }
        }
        (!targets.is_empty()).then(|| {
            Box::new(Learning { shadow: Arc::clone(self), targets, client: request.client_ip, started: Instant::now() })
        })
    }

    /// The fake for `request` (its method, its host as [`host_of`] reads it, its path, its
    /// cookies) that `ban` answers under `policy`.
    pub(crate) fn fake<B>(
        self: &Arc<Self>,
        policy: &Policy,
        ban: Ban,
        request: &http::Request<B>,
        options: Options,
    ) -> Fake {
        let Ban { status, body, content_type, fields } = ban;
        let (method, host, path) =
            (request.method().as_str(), host_of(request.uri(), request.headers()), request.uri().path());
        let path_match = policy.rules.named(&fields.policy).map(|(_, rule)| rule.path_match).unwrap_or_default();
        let routed = RequestPath::new(path);
        let rule_key = self.rule_key(&fields.policy, status);
        let host_key = self.host_key(&fields.policy, status, host);
        let route_key = self.route_key(&fields.policy, status, host, method, routed.key(path_match));
        let content_type = HeaderValue::from_str(&content_type).ok();
        // No cache keeps the fake past the time the client is let through again.
        let fresh_for = edge::retry_after_seconds(&fields.decision);
        let mut headers = HeaderMap::new();
        let (latency, sized) = {
            let mut shapes = self.shapes.lock().unwrap_or_else(PoisonError::into_inner);
            let Shapes { rules, hosts, routes, rng, .. } = &mut *shapes;
            // Another host's shape: its values are another site's, never replayed.
            let learned = routes.get(&route_key).or_else(|| hosts.get(&host_key)).map(|shape| (shape, true));
            match learned.or_else(|| rules.get(&rule_key).map(|shape| (shape, false))) {
                Some((shape, this_host)) => {
                    let cookies: SmallVec<[&HeaderValue; 2]> =
                        request.headers().get_all(header::COOKIE).iter().collect();
                    let fake = FakeFor {
                        length: body.len(),
                        content_type: content_type.as_ref(),
                        this_host,
                        cookies: &cookies,
                        fresh_for,
                    };
                    shape.write(&mut headers, &fake, SystemTime::now(), rng);
                    (shape.latency(rng), shape.sized())
                }
                None => {
                    if let Some(content_type) = content_type {
                        headers.insert(header::CONTENT_TYPE, content_type);
                    }
                    // A cache in front that stored it would answer it to every client.
                    if let Ok(line) = HeaderValue::from_str(&FakeCacheControl::alone(fresh_for)) {
                        headers.insert(header::CACHE_CONTROL, line);
                    }
                    (None, true)
                }
            }
        };
        if options.headers_on_allowed {
            // As the last allowed response said: nothing left (see the docs on what `t` is).
            let allowed = Decision { allowed: true, remaining: 0, retry_after_ns: 0, ..fields.decision };
            edge::http::rate_limit_fields(
                &mut headers,
                &fields.policy,
                &fields.limit,
                &allowed,
                options.legacy_headers,
            );
        }
        let body = if sized { Body::from(body) } else { Body::new(Unsized(Body::from(body))) };
        let mut response = Response::new(body);
        *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
        *response.headers_mut() = headers;
        let (wait, how) = match latency.map(|latency| latency.min(MAX_FAKE_DELAY)) {
            None => (None, "none_learned"),
            Some(delay) => match self.place() {
                Some(place) => (Some(Wait { delay, _place: place }), "learned"),
                None => (None, "over_cap"),
            },
        };
        self.metrics.fakes.get_or_create(&FakeLabels { rule: fields.policy.clone(), delay: how }).inc();
        Fake { response, wait }
    }

    /// One of the places for waiting fakes, if one is free.
    fn place(self: &Arc<Self>) -> Option<Place> {
        let max = self.max_waiting;
        self.waiting.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1)).ok()?;
        self.metrics.waiting.inc();
        Some(Place(Arc::clone(self)))
    }
}

/// The host a request names, as the shapes are keyed: its target's authority (absolute form),
/// else its first `Host` line (a request whose `Host` lines differ is refused before when a rule
/// reads the host; else the first is as good a key as any), without its port.
pub(crate) fn host_of<'r>(uri: &'r http::Uri, headers: &'r HeaderMap) -> &'r str {
    let host = uri.host().or_else(|| headers.get(header::HOST).and_then(|host| host.to_str().ok())).unwrap_or("");
    tollgate_rules::canonical::host(host)
}

/// A host as a key: its letters' case ignored (`Example.COM` is `example.com`).
struct HostKey<'h>(&'h str);

impl Hash for HostKey<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        for byte in self.0.bytes() {
            state.write_u8(byte.to_ascii_lowercase());
        }
        // As `str` does: a host is never a prefix of the next field.
        state.write_u8(0xff);
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FakeLabels {
    rule: String,
    delay: &'static str,
}

#[derive(Debug, Default)]
struct Metrics {
    fakes: Family<FakeLabels, Counter>,
    waiting: Gauge,
}

/// A body that does not give its length, so that the server sends it chunked, as the route's
/// real responses were.
struct Unsized(Body);

impl http_body::Body for Unsized {
    type Data = Bytes;
    type Error = axum_core::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.0).poll_frame(cx)
    }
}
