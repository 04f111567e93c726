//! [`RedisStore`]: state in Redis, every decision one atomic script call (feature `redis`).
//!
//! - **Where.** One server, a Redis Cluster or the primary of a Sentinel group, plain or TLS, as
//!   a [`RedisTarget`] says (parsed from `redis://`, `rediss+cluster://`, `redis+sentinel://`…
//!   URLs). tollgate follows the topology itself: a cluster's slot map is kept current through
//!   failovers and reshards (`MOVED`, `ASK`, `READONLY`), a Sentinel group's primary through its
//!   switches (the client crate below this one, `tollgate-redis-client`, does: its `cluster.rs`
//!   and `sentinel.rs`).
//! - **One script, one round trip.** `lua/` holds all seven algorithms, one file each, and
//!   `lua/decide.lua` the entry; a check or a multi-key check is one `FCALL` (a Redis Function,
//!   loaded where missing; `EVALSHA` on a server without functions: see `program.rs`). Every key
//!   the script writes gets its TTL in the same call: the time until its state is idle again.
//! - **One clock.** By default the script reads the Redis server's `TIME`, so a fleet of callers
//!   shares one clock. A caller-side [`Clock`] may be given instead (the conformance suite uses a
//!   manual one); TTLs then get a margin (default 60 s) for the skew between that clock and the
//!   server's.
//! - **Exact nanoseconds.** Lua numbers are doubles; the script keeps instants as decimal strings
//!   and computes around "now" so that every value it handles is exact, for every limit `Limit`
//!   accepts (periods and `burst * T` up to 50 days).
//! - **Bounded waits.** Each call has a timeout (default 50 ms), redirects included; each
//!   server has one connection that batches (the calls ready in the same instant go out in one
//!   write, see the client's `wire.rs`) and reconnects by itself. A call that may have run is
//!   never sent twice.
//! - **A remote for the failure policy** ([`Remote`]): the script also records charges (what a
//!   node admitted while Redis could not be reached) and answers each key's snapshot and the
//!   server's time, which [`Fallback`](crate::Fallback) uses.

mod across;
mod carry;
#[cfg(all(test, feature = "testkit"))]
mod credentials;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod hold;
mod keys;
mod lease;
pub mod program;
mod reply;
mod reservations;

use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{Clock, Limit};

use crate::remote::{Charge, Domain, Remote, Reply};
use crate::{Check, Refund, Reserved, Store, StoreError};
use program::*;
use reply::{check_prefix, parse_lease_reply, parse_reply, script_error, server_time_ns};
pub use tollgate_redis_client::slot as hash_slot;
/// Which Redis to reach and how, parsed from a URL (the client's: `tollgate_redis_client`).
pub use tollgate_redis_client::target;
pub use tollgate_redis_client::{Address, RedisTarget, TlsConfig, Topology};
use tollgate_redis_client::{Connection, Script};

/// Where the Redis store takes "now" from.
#[derive(Debug, Clone)]
pub enum TimeSource {
    /// The Redis server's `TIME` (the default): one clock for every caller.
    Server,
    /// A caller-side clock, passed with every call.
    Clock(Arc<dyn Clock>),
}

/// Options of a [`RedisStore`].
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// Prefix of every key (default `tollgate`; no `{` or `}`).
    pub prefix: String,
    /// The longest a call may take before it fails with [`StoreError::Timeout`] (default 50 ms).
    pub timeout: Duration,
    /// Where "now" comes from (default: the server's `TIME`).
    pub time: TimeSource,
    /// Added to every TTL when the time comes from a caller-side clock (default 60 s).
    pub clock_skew_margin: Duration,
    /// Sends lone checks to tollgate's native module (`TOLLGATE.CHECK`, see
    /// `tollgate-redis-module`) on servers that have it loaded; the script serves every other call, and every call on a server without it
    /// (default false).
    pub module: bool,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            prefix: "tollgate".into(),
            timeout: Duration::from_millis(50),
            time: TimeSource::Server,
            clock_skew_margin: Duration::from_secs(60),
            module: false,
        }
    }
}

/// A [`Store`] on Redis: one server, a Redis Cluster or a Sentinel group's primary.
#[derive(Clone)]
pub struct RedisStore {
    connection: Connection,
    options: RedisOptions,
    script: Arc<Script>,
    /// The script carrying a key's use to another algorithm (see `carry`).
    carry_script: Arc<Script>,
    /// The script holding a key (see `hold`).
    hold_script: Arc<Script>,
    /// The script settling a reservation (see `reservations`).
    settle_script: Arc<Script>,
    /// Script calls sent (one `FCALL` or `EVALSHA` each), for the calls-per-decision figure.
    script_calls: Arc<std::sync::atomic::AtomicU64>,
}

/// What a call answered: its reply (and a lease's figures), or a guard's refusal code.
enum Guarded {
    Ran(Reply, Option<(u64, u64)>),
    Refused(i64),
}

/// The lease part of a script call.
#[derive(Debug, Clone, Copy)]
struct LeaseArgs {
    lessee: u64,
    lifetime_ms: u64,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("connection", &self.connection.kind())
            .field("options", &self.options)
            .finish()
    }
}

impl RedisStore {
    /// A store on the Redis that `url` names (any form [`RedisTarget::parse`] reads:
    /// `redis://host:port/db`, `redis+cluster://…`, `redis+sentinel://…`, and their TLS forms
    /// with the system's roots). Returns at once: connections are made on first use and remade
    /// after failures, so a store can be created while Redis is down.
    pub fn open(url: &str, options: RedisOptions) -> Result<Self, StoreError> {
        let target = RedisTarget::parse(url).map_err(StoreError::Unsupported)?;
        RedisStore::connect(&target, options)
    }

    /// A store on the Redis Cluster reachable through any of `nodes` (`redis://host:port`).
    /// Returns at once, as [`open`](Self::open): the slot map is read on first use, again while
    /// no node answers, so a store can be created while the cluster is down.
    /// Each node's URL may carry the credentials; they must be the same on every node.
    pub async fn open_cluster(nodes: &[String], options: RedisOptions) -> Result<Self, StoreError> {
        let targets = nodes.iter().map(|n| RedisTarget::parse(n)).collect::<Result<Vec<_>, _>>();
        let targets = targets.map_err(StoreError::Unsupported)?;
        let Some(first) = targets.first() else {
            return Err(StoreError::Unsupported("a cluster needs at least one node".into()));
        };
        let mut seeds = Vec::new();
        for target in &targets {
            let Topology::Server(address) = &target.topology else {
                return Err(StoreError::Unsupported(format!("{}: a node is one server's URL", target.redacted())));
            };
            if (&target.username, &target.password, target.tls.is_some())
                != (&first.username, &first.password, first.tls.is_some())
            {
                return Err(StoreError::Unsupported("the nodes of one cluster share their credentials and TLS".into()));
            }
            seeds.push(address.clone());
        }
        let target = RedisTarget { topology: Topology::Cluster(seeds), db: 0, ..first.clone() };
        RedisStore::connect(&target, options)
    }

    /// A store on `target`. Returns at once, as [`open`](Self::open).
    pub fn connect(target: &RedisTarget, options: RedisOptions) -> Result<Self, StoreError> {
        check_prefix(&options.prefix)?;
        let connection = Connection::open(target, options.timeout)?;
        Ok(RedisStore::with(connection, options))
    }

    fn is_cluster(&self) -> bool {
        self.connection.is_cluster()
    }

    /// Why Redis cannot be used, in tollgate's words (which server, and what to check: a
    /// certificate that does not verify names the host and the CA), or `None` if every server
    /// calls go to answers a connection of its own.
    pub async fn diagnose(&self) -> Option<String> {
        self.connection.diagnose().await
    }

    fn with(connection: Connection, options: RedisOptions) -> Self {
        RedisStore {
            connection,
            options,
            script: Arc::new(program::decide()),
            carry_script: Arc::new(program::script("carry")),
            hold_script: Arc::new(program::script("hold")),
            settle_script: Arc::new(program::script("settle")),
            script_calls: Arc::default(),
        }
    }

    /// How many script calls (`FCALL` or `EVALSHA`) this store and its clones have sent: the Redis calls
    /// behind its decisions.
    #[must_use]
    pub fn script_calls(&self) -> u64 {
        self.script_calls.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// This store's options.
    #[must_use]
    pub fn options(&self) -> &RedisOptions {
        &self.options
    }

    /// This store's connection with other options (another prefix, clock or timeout).
    pub fn with_options(&self, options: RedisOptions) -> Result<Self, StoreError> {
        check_prefix(&options.prefix)?;
        Ok(RedisStore {
            connection: self.connection.clone(),
            options,
            script: self.script.clone(),
            carry_script: self.carry_script.clone(),
            hold_script: self.hold_script.clone(),
            settle_script: self.settle_script.clone(),
            script_calls: self.script_calls.clone(),
        })
    }

    /// The Redis key that holds the state of `key` in `scope` under `limit` (see the key scheme
    /// in `keys`).
    pub fn state_key(&self, scope: &str, key: &[u8], limit: &Limit) -> Result<Vec<u8>, StoreError> {
        keys::state_key(&self.options.prefix, scope, limit.algorithm(), key)
    }

    /// Writes a call's header: the layout's version, now (the store's clock's, or '' for the
    /// server's), the TTL margin, and how many checks, charges and refunds follow.
    fn header(&self, call: &mut Call, checks: usize, charges: usize, refunds: usize) {
        match &self.options.time {
            TimeSource::Server => {
                // Calendar windows are sent around this machine's now; the script picks by its own.
                let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
                call.client_now(u64::try_from(now.as_nanos()).unwrap_or(u64::MAX));
                call.put(ARG_VERSION, VERSION).put(ARG_NOW_SEC, "").put(ARG_NOW_NSEC, "")
            }
            TimeSource::Clock(clock) => {
                let now = clock.now_ns();
                call.client_now(now);
                call.put(ARG_VERSION, VERSION)
                    .put(ARG_NOW_SEC, now / 1_000_000_000)
                    .put(ARG_NOW_NSEC, now % 1_000_000_000)
            }
        };
        let margin_ms = match self.options.time {
            TimeSource::Server => 0,
            TimeSource::Clock(_) => u64::try_from(self.options.clock_skew_margin.as_millis()).unwrap_or(u64::MAX),
        };
        call.put(ARG_MARGIN, margin_ms).put(ARG_CHECKS, checks).put(ARG_CHARGES, charges).put(ARG_REFUNDS, refunds);
    }

    /// Applies `refunds`, records `charges` and decides `checks` in one script call (all of their
    /// keys in one slot on a cluster).
    async fn call(
        &self,
        checks: &[Check<'_>],
        charges: &[Charge<'_>],
        refunds: &[Refund<'_>],
    ) -> Result<Reply, StoreError> {
        Ok(self.invoke(checks, charges, refunds, None).await?.0)
    }

    /// [`call`](Self::call), or with `lease` a lease of its one check (see `lease.rs`), answering
    /// then the units granted and the lessees counted.
    async fn invoke(
        &self,
        checks: &[Check<'_>],
        charges: &[Charge<'_>],
        refunds: &[Refund<'_>],
        lease: Option<LeaseArgs>,
    ) -> Result<(Reply, Option<(u64, u64)>), StoreError> {
        match self.invoke_guarded(checks, charges, refunds, lease, None).await? {
            Guarded::Ran(reply, lease) => Ok((reply, lease)),
            Guarded::Refused(code) => {
                Err(StoreError::Backend(format!("the script refused an unguarded call ({code})")))
            }
        }
    }

    /// [`invoke`](Self::invoke), or with `guard` through the settle script: the call runs only if
    /// the guard's record holds what the guard says (see `reservations`), else it is refused with
    /// the script's code.
    async fn invoke_guarded(
        &self,
        checks: &[Check<'_>],
        charges: &[Charge<'_>],
        refunds: &[Refund<'_>],
        lease: Option<LeaseArgs>,
        guard: Option<&reservations::Guard<'_>>,
    ) -> Result<Guarded, StoreError> {
        if let Some(c) = checks.iter().find(|c| c.cost > c.limit.capacity()) {
            return Err(tollgate_core::Error::CostExceedsCapacity { cost: c.cost, capacity: c.limit.capacity() }.into());
        }
        crate::remote::check_totals(charges)?;
        let mut keys = checks
            .iter()
            .chain(charges.iter().map(|c| &c.check))
            .chain(refunds.iter().map(|r| &r.check))
            .map(|c| self.state_key(c.scope, c.key, c.limit))
            .collect::<Result<Vec<_>, _>>()?;
        if keys.is_empty() && guard.is_none() {
            return Err(StoreError::NoChecks);
        }
        // Each charge's and each refund's marker (what the key was given: nodes' running totals, its
        // latest refund, a recent reset).
        let applied: Vec<Vec<u8>> =
            keys[checks.len()..].iter().map(|k| keys::applied_key(&self.options.prefix, k)).collect();
        keys.extend(applied);
        // The hold key of each check asking for its hold (in its state key's slot).
        for check in checks.iter().filter(|c| c.hold) {
            keys.push(keys::hold_key(&self.options.prefix, check.scope, check.key)?);
        }
        if lease.is_some() {
            keys.push(keys::lessees_key(&self.options.prefix, &keys[0]));
        }
        // The server the call goes to: the guard's record's (in the slot of every key), or the
        // first key's.
        let route: &[u8] = match guard {
            Some(guard) => guard.record,
            None => &keys[0],
        };
        if self.is_cluster() {
            let slot = keys::slot(route);
            if keys.iter().any(|k| keys::slot(k) != slot) {
                return Err(StoreError::CrossSlot);
            }
        }
        // The native module decides a lone check of its algorithms where it is loaded (the
        // client sends it to the script elsewhere: `program::decide`).
        let native = self.options.module
            && guard.is_none()
            && lease.is_none()
            && checks.iter().all(|c| !c.hold)
            && charges.is_empty()
            && refunds.is_empty()
            && matches!(checks, [check] if module_decides(check.limit.algorithm()) && check.limit.calendar().is_none());
        let script = if guard.is_some() { &self.settle_script } else { &self.script };
        let mut call = match guard {
            _ if native => Call::module(&keys[0]),
            Some(guard) => Call::guarded(
                script,
                guard.record,
                &keys,
                &[guard.content.as_bytes(), guard.deadline_ms.to_string().as_bytes()],
            ),
            None => Call::new(script, &keys),
        };
        self.header(&mut call, checks.len(), charges.len(), refunds.len());
        for check in checks {
            call.part(CHECK_ARGS).limit(check.limit, check.cost).put(CHECK_HOLD, u8::from(check.hold));
        }
        for charge in charges {
            call.charge_at(Some(call.client_now_ns().saturating_sub(charge.age_ns)));
            call.part(CHARGE_ARGS).limit(charge.check.limit, charge.check.cost).put(CHARGE_AGE, charge.age_ns);
            match charge.origin {
                Some(origin) => call.put(CHARGE_NODE, format!("{:016x}", origin.node)).put(CHARGE_TOTAL, origin.total),
                None => call.put(CHARGE_NODE, "").put(CHARGE_TOTAL, 0),
            };
            match charge.known_remaining {
                Some(known) => call.put(CHARGE_KNOWN, known),
                None => call.put(CHARGE_KNOWN, -1),
            };
            match charge.seen {
                Some(seen) => call
                    .put(CHARGE_SEEN_AT, seen.at)
                    .put(CHARGE_SEEN_USED, seen.used)
                    .put(CHARGE_SEEN_PREVIOUS, seen.previous),
                None => call.put(CHARGE_SEEN_AT, "").put(CHARGE_SEEN_USED, 0).put(CHARGE_SEEN_PREVIOUS, 0),
            };
            call.put(CHARGE_VIEW, u8::from(charge.view));
        }
        call.charge_at(None);
        for refund in refunds {
            // A calendar refund is located among the windows around its admission, however long ago.
            call.client_now(refund.at);
            call.part(REFUND_ARGS)
                .limit(refund.check.limit, refund.check.cost)
                .put(REFUND_AT, refund.at)
                .put(REFUND_RESET, refund.decision.reset_after_ns);
        }
        if let Some(lease) = lease {
            call.part(LEASE_ARGS).put(LEASE_LESSEE, lease.lessee).put(LEASE_LIFETIME, lease.lifetime_ms);
        }
        let cmd = call.into_cmd();
        self.script_calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let call = self.connection.run(route, &cmd, Some(script));
        let reply = tokio::time::timeout(self.options.timeout, call)
            .await
            .map_err(|_| StoreError::Timeout(self.options.timeout))?
            .map_err(|failure| script_error(&failure, &keys))?;
        let reply: Vec<i64> = redis::from_redis_value(reply)
            .map_err(|e| StoreError::Backend(format!("the script answered something else than integers: {e}")))?;
        if let (Some(_), [code]) = (guard, reply.as_slice()) {
            return Ok(Guarded::Refused(*code));
        }
        let parsed = match (lease, checks) {
            (None, _) => (parse_reply(&reply, checks.len())?, None),
            (Some(_), [check]) => {
                let (reply, granted, lessees) = parse_lease_reply(&reply, check.cost)?;
                (reply, Some((granted, lessees)))
            }
            (Some(_), _) => return Err(StoreError::Backend("a lease is of one check".into())),
        };
        if let Some(&i) = parsed.0.held.iter().find(|&&i| checks.get(i).is_none_or(|c| !c.hold)) {
            return Err(StoreError::Backend(format!("the script answered check {i} held, which asked for no hold")));
        }
        Ok(Guarded::Ran(parsed.0, parsed.1))
    }
}

impl Store for RedisStore {
    /// One script call when every key shares a slot; see [`RedisStore::decide_across`] otherwise.
    async fn reserve(&self, checks: &[Check<'_>]) -> Result<Reserved, StoreError> {
        if checks.is_empty() {
            return Err(StoreError::NoChecks);
        }
        let reply = match self.decide_across(checks, &[]).await {
            Ok(reply) => reply,
            Err(StoreError::Partial(partial)) => {
                // All or nothing: what the servers that answered admitted is given back (boxed:
                // a rare path, whose future every decision's would otherwise carry).
                Box::pin(self.give_back(checks, &partial.decided)).await;
                return Err(partial.error);
            }
            Err(error) => return Err(error),
        };
        let per_check = if reply.snapshots.iter().all(|s| s.at == reply.now_ns) {
            Vec::new()
        } else {
            reply.snapshots.iter().map(|s| s.at).collect()
        };
        Ok(Reserved { decisions: reply.decisions, at: reply.now_ns, per_check, held: reply.held })
    }

    /// As the charges of a call deciding nothing (see [`Remote::decide`]).
    async fn charge(&self, checks: &[Check<'_>]) -> Result<(), StoreError> {
        let charges: Vec<Charge<'_>> = checks.iter().map(|c| Charge::new(*c, 0)).collect();
        Remote::decide(self, &[], &charges).await.map(drop)
    }

    async fn refund(&self, refunds: &[Refund<'_>]) -> Result<(), StoreError> {
        let refunds: Vec<Refund<'_>> =
            refunds.iter().filter(|r| r.decision.allowed && r.check.cost > 0).copied().collect();
        for group in self.by_slot(&refunds, |r| r.check)? {
            self.call(&[], &[], &group).await?;
        }
        Ok(())
    }

    async fn reserve_until(
        &self,
        checks: &[Check<'_>],
        ttl_ns: u64,
    ) -> Result<(Reserved, Option<crate::Reservation>), StoreError> {
        self.reserve_recorded(checks, ttl_ns).await
    }

    async fn settle(&self, id: &str, actual: u64) -> Result<crate::Settled, StoreError> {
        self.settle_recorded(id, actual).await
    }

    async fn reset(&self, scope: &str, key: &[u8], limit: &Limit) -> Result<(), StoreError> {
        let hold = keys::hold_key(&self.options.prefix, scope, key)?;
        let key = self.state_key(scope, key, limit)?;
        let marker = keys::applied_key(&self.options.prefix, &key);
        let run = |cmd: redis::Cmd| {
            let key = &key;
            async move {
                tokio::time::timeout(self.options.timeout, self.connection.run(key, &cmd, None))
                    .await
                    .map_err(|_| StoreError::Timeout(self.options.timeout))?
                    .map_err(|failure| script_error(&failure, std::slice::from_ref(key)))
            }
        };
        // The marker is stamped first with the reset's instant (on the script's clock), for as
        // long as any node's view of the key can matter (a node then never gives back to the key
        // what it knew of it before the reset), and the state goes last: a reset cut short leaves
        // the state, and the caller an error.
        let now_ns = match &self.options.time {
            TimeSource::Clock(clock) => clock.now_ns(),
            TimeSource::Server => server_time_ns(run(redis::cmd("TIME")).await?)?,
        };
        let mut stamp = redis::cmd("HSET");
        stamp.arg(marker.as_slice()).arg("reset").arg(now_ns);
        run(stamp).await?;
        let horizon_ms = limit.tolerance_ns().max(2 * limit.period_ns()).div_ceil(1_000_000) + 1_000;
        let ttl: i64 = redis::from_redis_value(run(redis::cmd("PTTL").arg(marker.as_slice()).clone()).await?)
            .map_err(|e| StoreError::Backend(format!("PTTL answered something else: {e}")))?;
        // Never shortened: it may remember charges for longer.
        if ttl < 0 || ttl.unsigned_abs() < horizon_ms {
            run(redis::cmd("PEXPIRE").arg(marker.as_slice()).arg(horizon_ms).clone()).await?;
        }
        run(redis::cmd("DEL").arg(key.as_slice()).clone()).await?;
        // The hold too, in the state's slot (a reset cut short before it leaves the hold, and
        // the caller an error).
        run(redis::cmd("DEL").arg(hold.as_slice()).clone()).await?;
        Ok(())
    }

    async fn carry(&self, scope: &str, key: &[u8], from: &Limit, to: &Limit) -> Result<u64, StoreError> {
        self.carry_use(scope, key, from, to).await
    }

    async fn hold(&self, scope: &str, key: &[u8], hold_ns: u64) -> Result<(), StoreError> {
        self.hold_key_for(scope, key, hold_ns).await
    }
}

impl Remote for RedisStore {
    async fn decide(&self, checks: &[Check<'_>], charges: &[Charge<'_>]) -> Result<Reply, StoreError> {
        if checks.is_empty() {
            // Charges only (a flush): slot by slot.
            let mut now_ns = 0;
            for group in self.groups(&[], charges)? {
                now_ns = now_ns.max(self.call(&[], &group.charges, &[]).await?.now_ns);
            }
            return Ok(Reply::new(Vec::new(), Vec::new(), now_ns));
        }
        self.decide_across(checks, charges).await
    }

    /// The server that holds `check`'s key now (a cluster's slot owner, the Sentinels' primary).
    fn domain(&self, check: &Check<'_>) -> Domain {
        if !self.is_cluster() {
            // One server (or the Sentinels' primary) holds every key: no key to build. A scope
            // Redis cannot hold is no server's (its calls fail with that error, breaker or not).
            return match keys::usable_scope(check.scope) {
                Ok(()) => self.connection.domain(b""),
                Err(_) => Domain::from(""),
            };
        }
        match self.state_key(check.scope, check.key, check.limit) {
            Ok(key) => self.connection.domain(&key),
            Err(_) => Domain::from(""),
        }
    }

    async fn probe_domain(&self, domain: &Domain) -> Result<bool, StoreError> {
        let within = self.options.timeout.max(Duration::from_secs(1));
        Ok(tokio::time::timeout(within, self.connection.probe_domain(domain))
            .await
            .map_err(|_| StoreError::Timeout(within))??)
    }

    /// Reads the topology again (a cluster's slot map, the Sentinels' primary) and pings a
    /// primary, within the store's timeout or a second, whichever is longer (a topology read
    /// may try several servers).
    async fn probe(&self) -> Result<(), StoreError> {
        let within = self.options.timeout.max(Duration::from_secs(1));
        Ok(tokio::time::timeout(within, self.connection.probe()).await.map_err(|_| StoreError::Timeout(within))??)
    }
}
