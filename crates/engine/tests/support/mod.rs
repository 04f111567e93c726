//! Shared by the engine's integration tests: an [`Engine`] built from a rules TOML on a manual
//! clock shared with its store ([`harness`], [`build`]), a request builder ([`get`], [`post`],
//! [`Req`]), and readers for what the engine decided, what a rule has left in the store and
//! what its metrics counted. Every instant is the manual clock's: no test reads the wall clock.
//!
//! Each test file includes this module and uses part of it.
#![allow(dead_code)]

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use tollgate_core::ManualClock;
use tollgate_engine::{Admission, Answer, Engine, EngineBuilder, Proceed, Request};
use tollgate_rules::Rules;
use tollgate_store::{Check, MemoryStore, Store};

pub(crate) const SEC: u64 = 1_000_000_000;
pub(crate) const MS: u64 = 1_000_000;
/// The tests' start: on a whole hour, so that fixed windows of a second, ten seconds, a minute or
/// an hour all start exactly there.
pub(crate) const T0: u64 = 1_699_999_200 * SEC;

/// A request, owned; [`Harness::admit`] lends it to the engine as a [`Request`].
#[derive(Debug, Clone)]
pub(crate) struct Req {
    method: String,
    path: String,
    query: String,
    host: String,
    headers: Vec<(String, Vec<u8>)>,
    client_ip: IpAddr,
    key: Option<Vec<u8>>,
}

/// `METHOD target` (the target's query, after `?`, is the request's query) from 192.0.2.1.
pub(crate) fn req(method: &str, target: &str) -> Req {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    Req {
        method: method.into(),
        path: path.into(),
        query: query.into(),
        host: String::new(),
        headers: Vec::new(),
        client_ip: "192.0.2.1".parse().unwrap(),
        key: None,
    }
}

/// `GET target` from 192.0.2.1.
pub(crate) fn get(target: &str) -> Req {
    req("GET", target)
}

/// `POST target` from 192.0.2.1.
pub(crate) fn post(target: &str) -> Req {
    req("POST", target)
}

impl Req {
    /// From this client address (as the front end resolved it).
    pub(crate) fn from(mut self, ip: &str) -> Self {
        self.client_ip = ip.parse().unwrap();
        self
    }

    /// For this (canonical) host.
    pub(crate) fn host(mut self, host: &str) -> Self {
        self.host = host.into();
        self
    }

    /// With this header line.
    pub(crate) fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.into(), value.as_bytes().to_vec()));
        self
    }

    /// With this header line, its value any bytes (UTF-8 or not).
    pub(crate) fn header_bytes(mut self, name: &str, value: &[u8]) -> Self {
        self.headers.push((name.into(), value.to_vec()));
        self
    }

    /// With this cookie (a `Cookie` line of its own).
    pub(crate) fn cookie(self, name: &str, value: &str) -> Self {
        self.header("cookie", &format!("{name}={value}"))
    }

    /// With the caller's key (the `key` characteristic).
    pub(crate) fn key(mut self, key: &str) -> Self {
        self.key = Some(key.as_bytes().to_vec());
        self
    }

    /// The request as the rules see it, with `headers` (this request's, borrowed).
    fn request<'a>(&'a self, headers: &'a [(&'a str, &'a [u8])]) -> Request<'a> {
        Request {
            method: &self.method,
            path: &self.path,
            query: &self.query,
            host: &self.host,
            headers,
            client_ip: self.client_ip,
            key: self.key.as_deref(),
            ja3: None,
            ja4: None,
            from_trusted_proxy: false,
        }
    }
}

/// An engine, the manual clock it and its store share, and its metrics registry.
pub(crate) struct Harness<S = MemoryStore> {
    pub(crate) engine: Engine<S>,
    pub(crate) clock: Arc<ManualClock>,
    registry: Registry,
}

/// A manual clock at [`T0`].
pub(crate) fn clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::new(T0))
}

/// A memory store on `clock`.
pub(crate) fn memory(clock: &Arc<ManualClock>) -> MemoryStore {
    MemoryStore::builder().clock(clock.clone()).build()
}

/// `rules` on a memory store, on a front end that does not route (the middleware's default).
pub(crate) fn harness(rules: &str) -> Harness {
    let clock = clock();
    build(memory(&clock), clock, rules, false)
}

/// `rules` on a memory store, on a front end that routes (`tollgate proxy`).
pub(crate) fn routing(rules: &str) -> Harness {
    let clock = clock();
    build(memory(&clock), clock, rules, true)
}

/// `rules` on `store`, timed by `clock` (the store's own, for exact decisions).
pub(crate) fn build<S: Store>(store: S, clock: Arc<ManualClock>, rules: &str, routes: bool) -> Harness<S> {
    let mut registry = Registry::with_prefix("tollgate");
    let rules = Rules::parse(rules, "test").unwrap_or_else(|e| panic!("{e}"));
    let engine = Engine::builder(store, rules).clock(clock.clone()).routes(routes).build(&mut registry);
    Harness { engine, clock, registry }
}

/// `rules` on `store`, timed by `clock`, the engine built as `tune` says.
pub(crate) fn build_tuned<S: Store>(
    store: S,
    clock: Arc<ManualClock>,
    rules: &str,
    tune: impl FnOnce(EngineBuilder<S>) -> EngineBuilder<S>,
) -> Harness<S> {
    let mut registry = Registry::with_prefix("tollgate");
    let rules = Rules::parse(rules, "test").unwrap_or_else(|e| panic!("{e}"));
    let engine = tune(Engine::builder(store, rules).clock(clock.clone())).build(&mut registry);
    Harness { engine, clock, registry }
}

/// `rules` on a memory store, the engine built as `tune` says.
pub(crate) fn tuned(
    rules: &str,
    tune: impl FnOnce(EngineBuilder<MemoryStore>) -> EngineBuilder<MemoryStore>,
) -> Harness {
    let clock = clock();
    let mut registry = Registry::with_prefix("tollgate");
    let rules = Rules::parse(rules, "test").unwrap_or_else(|e| panic!("{e}"));
    let engine = tune(Engine::builder(memory(&clock), rules).clock(clock.clone())).build(&mut registry);
    Harness { engine, clock, registry }
}

/// `rules` on a memory store that keeps no holds ([`NoHolds`]: the engine's table alone holds
/// keys), holding at most `max_blocks` keys under mitigation.
pub(crate) fn holding(rules: &str, max_blocks: usize) -> Harness<NoHolds> {
    let clock = clock();
    let mut registry = Registry::with_prefix("tollgate");
    let rules = Rules::parse(rules, "test").unwrap_or_else(|e| panic!("{e}"));
    let store = NoHolds(memory(&clock));
    let engine = Engine::builder(store, rules).clock(clock.clone()).max_blocks(max_blocks).build(&mut registry);
    Harness { engine, clock, registry }
}

/// A memory store keeping no holds (`Store::hold` answers `Unsupported`, as a store's default
/// does): what the engine's own table of holds does alone.
#[derive(Debug)]
pub(crate) struct NoHolds(pub(crate) MemoryStore);

impl Store for NoHolds {
    async fn reserve(&self, checks: &[Check<'_>]) -> Result<tollgate_store::Reserved, tollgate_store::StoreError> {
        self.0.reserve(checks).await
    }

    async fn refund(&self, refunds: &[tollgate_store::Refund<'_>]) -> Result<(), tollgate_store::StoreError> {
        self.0.refund(refunds).await
    }

    async fn reset(
        &self,
        scope: &str,
        key: &[u8],
        limit: &tollgate_core::Limit,
    ) -> Result<(), tollgate_store::StoreError> {
        self.0.reset(scope, key, limit).await
    }

    fn decides_in_place(&self) -> bool {
        true
    }
}

/// What a request got, in a word: `proceed`, `429:RULE`, `shadow:RULE`, `route:RULE`, `400` or
/// `503`.
pub(crate) fn describe(admission: &Admission) -> String {
    match admission {
        Admission::Proceed(_) => "proceed".into(),
        Admission::Answer(Answer::TooMany(fields)) => format!("429:{}", fields.policy),
        Admission::Answer(Answer::ShadowBan { fields, .. }) => format!("shadow:{}", fields.policy),
        Admission::Answer(Answer::Route { fields, .. }) => format!("route:{}", fields.policy),
        Admission::Answer(Answer::BadRequest(_)) => "400".into(),
        Admission::Answer(Answer::Unavailable(_)) => "503".into(),
    }
}

impl<S: Store> Harness<S> {
    /// The engine's admission of `req`, under the rules in force.
    pub(crate) async fn admit(&self, req: &Req) -> Admission {
        let headers: Vec<(&str, &[u8])> = req.headers.iter().map(|(n, v)| (n.as_str(), v.as_slice())).collect();
        let request = req.request(&headers);
        self.engine.admit(&self.engine.policy(), &request).await
    }

    /// The admission of `req`, which must be let through.
    pub(crate) async fn proceed(&self, req: &Req) -> Proceed {
        match self.admit(req).await {
            Admission::Proceed(proceed) => proceed,
            other => panic!("{req:?} was answered {}", describe(&other)),
        }
    }

    /// What `req` got (see [`describe`]); its reservations, if any, stay counted.
    pub(crate) async fn outcome(&self, req: &Req) -> String {
        describe(&self.admit(req).await)
    }

    /// `n` requests `req`, each described.
    pub(crate) async fn outcomes(&self, req: &Req, n: usize) -> Vec<String> {
        let mut got = Vec::with_capacity(n);
        for _ in 0..n {
            got.push(self.outcome(req).await);
        }
        got
    }

    /// What is left of `key`'s limit under `rule`, by a peek (which changes nothing).
    pub(crate) async fn remaining(&self, rule: &str, key: &str) -> u64 {
        let policy = self.engine.policy();
        let (_, rule) = policy.rules.named(rule).unwrap_or_else(|| panic!("no rule {rule}"));
        let check = Check::new(key.as_bytes(), &rule.limit, 0).scoped(&rule.name);
        self.engine.store().check_one(check).await.unwrap().remaining
    }

    /// Moves the shared clock on.
    pub(crate) fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }

    /// The metrics, as OpenMetrics text.
    pub(crate) fn metrics(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).unwrap();
        text
    }

    /// `tollgate_rule_decisions_total{rule, outcome}` (0 while the series does not exist).
    pub(crate) fn counted(&self, rule: &str, outcome: &str) -> u64 {
        self.series(&format!("tollgate_rule_decisions_total{{rule=\"{rule}\",outcome=\"{outcome}\"}}"))
    }

    /// The value of the series named exactly `name` (with its labels), 0 if absent.
    pub(crate) fn series(&self, name: &str) -> u64 {
        let text = self.metrics();
        text.lines()
            .find_map(|line| line.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
            .map_or(0, |value| value.trim().parse().unwrap_or_else(|_| panic!("{name}: {value}")))
    }
}

/// Milliseconds as a [`Duration`].
pub(crate) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Seconds as a [`Duration`].
pub(crate) fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}
