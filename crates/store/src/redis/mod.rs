//! [`RedisStore`]: state in Redis or Redis Cluster, every decision one atomic script call
//! (feature `redis`).
//!
//! - **One script, one round trip.** `decide.lua` holds all seven algorithms; a check or a
//!   multi-key check is one `EVALSHA` (reloaded transparently after `NOSCRIPT`). Every key the
//!   script writes gets its TTL in the same call: the time until its state is idle again.
//! - **One clock.** By default the script reads the Redis server's `TIME`, so a fleet of callers
//!   shares one clock. A caller-side [`Clock`] may be given instead (the conformance suite uses a
//!   manual one); TTLs then get a margin (default 60 s) for the skew between that clock and the
//!   server's.
//! - **Exact nanoseconds.** Lua numbers are doubles; the script keeps instants as decimal strings
//!   and computes around "now" so that every value it handles is exact, for every limit `Limit`
//!   accepts (periods and `burst * T` up to 50 days).
//! - **Bounded waits.** Each call has a timeout (default 50 ms); the connection is multiplexed
//!   (concurrent calls are pipelined automatically) and reconnects by itself.
//! - **A remote for the failure policy** ([`Remote`]): the script also records charges (what a
//!   node admitted while Redis could not be reached) and answers each key's snapshot and the
//!   server's time, which [`Fallback`](crate::Fallback) uses.

mod keys;
mod lease;
mod reply;

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use tollgate_core::{Clock, Decision, Limit, Snapshot};

use crate::remote::{Charge, Remote, Reply};
use crate::{Check, Refund, Reserved, Store, StoreError};
use reply::{backend, check_prefix, parse_reply, script_error};

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
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            prefix: "tollgate".into(),
            timeout: Duration::from_millis(50),
            time: TimeSource::Server,
            clock_skew_margin: Duration::from_secs(60),
        }
    }
}

#[derive(Clone)]
enum Connection {
    Single(ConnectionManager),
    Cluster(Arc<LazyCluster>),
}

/// A cluster connection made on first use (it learns the slots from a node then), and tried again
/// on the next call while no node answers; once made, it follows the cluster by itself.
struct LazyCluster {
    client: redis::cluster::ClusterClient,
    connection: tokio::sync::OnceCell<ClusterConnection>,
}

impl LazyCluster {
    async fn connection(&self) -> redis::RedisResult<ClusterConnection> {
        self.connection.get_or_try_init(|| self.client.get_async_connection()).await.cloned()
    }
}

impl Connection {
    /// Runs `cmd` on this connection.
    async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> redis::RedisResult<T> {
        match self {
            Connection::Single(c) => cmd.query_async(&mut c.clone()).await,
            Connection::Cluster(c) => cmd.query_async(&mut c.connection().await?).await,
        }
    }
}

/// A [`Store`] on Redis or Redis Cluster.
#[derive(Clone)]
pub struct RedisStore {
    connection: Connection,
    options: RedisOptions,
    script: Arc<redis::Script>,
    /// Script calls sent (one `EVALSHA` each), for the calls-per-decision figure.
    script_calls: Arc<std::sync::atomic::AtomicU64>,
}

/// The lease part of a script call.
#[derive(Debug, Clone, Copy)]
struct LeaseArgs {
    lessee: u64,
    lifetime_ms: u64,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.connection {
            Connection::Single(_) => "single",
            Connection::Cluster(_) => "cluster",
        };
        f.debug_struct("RedisStore").field("connection", &kind).field("options", &self.options).finish()
    }
}

impl RedisStore {
    /// A store on the Redis server at `url` (`redis://host:port/db`). Returns at once: the
    /// connection is made on first use and remade after failures, so a store can be created
    /// while Redis is down.
    pub fn open(url: &str, options: RedisOptions) -> Result<Self, StoreError> {
        check_prefix(&options.prefix)?;
        let client = redis::Client::open(url).map_err(|e| backend(&e))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(options.timeout))
            .set_response_timeout(Some(options.timeout))
            .set_number_of_retries(2)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_millis(100));
        let manager = ConnectionManager::new_lazy_with_config(client, config).map_err(|e| backend(&e))?;
        Ok(RedisStore::with(Connection::Single(manager), options))
    }

    /// A store on the Redis Cluster reachable through any of `nodes` (`redis://host:port`).
    /// Returns at once, as [`open`](Self::open): the connection (and the slot map) is made on
    /// first use, again on later calls while no node answers, so a store can be created while
    /// the cluster is down.
    pub async fn open_cluster(nodes: &[String], options: RedisOptions) -> Result<Self, StoreError> {
        check_prefix(&options.prefix)?;
        let client = redis::cluster::ClusterClientBuilder::new(nodes.to_vec())
            .connection_timeout(options.timeout)
            .response_timeout(options.timeout)
            .retries(2)
            .min_retry_wait(10)
            .max_retry_wait(100)
            .build()
            .map_err(|e| backend(&e))?;
        let lazy = LazyCluster { client, connection: tokio::sync::OnceCell::new() };
        Ok(RedisStore::with(Connection::Cluster(Arc::new(lazy)), options))
    }

    fn with(connection: Connection, options: RedisOptions) -> Self {
        RedisStore {
            connection,
            options,
            script: Arc::new(redis::Script::new(include_str!("decide.lua"))),
            script_calls: Arc::default(),
        }
    }

    /// How many script calls (`EVALSHA`) this store and its clones have sent: the Redis calls
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
            script_calls: self.script_calls.clone(),
        })
    }

    /// The Redis key that holds the state of `key` in `scope` under `limit` (see the key scheme
    /// in `keys`).
    pub fn state_key(&self, scope: &str, key: &[u8], limit: &Limit) -> Result<Vec<u8>, StoreError> {
        keys::state_key(&self.options.prefix, scope, limit.algorithm(), key)
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
        if let Some(c) = checks.iter().find(|c| c.cost > c.limit.capacity()) {
            return Err(tollgate_core::Error::CostExceedsCapacity { cost: c.cost, capacity: c.limit.capacity() }.into());
        }
        let mut keys = checks
            .iter()
            .chain(charges.iter().map(|c| &c.check))
            .chain(refunds.iter().map(|r| &r.check))
            .map(|c| self.state_key(c.scope, c.key, c.limit))
            .collect::<Result<Vec<_>, _>>()?;
        if keys.is_empty() {
            return Err(StoreError::NoChecks);
        }
        if lease.is_some() {
            keys.push(keys::lessees_key(&self.options.prefix, &keys[0]));
        }
        if matches!(self.connection, Connection::Cluster(_)) {
            let slot = redis::cluster_routing::Slot::for_key(&keys[0]);
            if keys.iter().any(|k| redis::cluster_routing::Slot::for_key(k) != slot) {
                return Err(StoreError::CrossSlot);
            }
        }
        let mut invocation = self.script.prepare_invoke();
        for key in &keys {
            invocation.key(key.as_slice());
        }
        match &self.options.time {
            TimeSource::Server => invocation.arg("").arg(""),
            TimeSource::Clock(clock) => {
                let now = clock.now_ns();
                invocation.arg(now / 1_000_000_000).arg(now % 1_000_000_000)
            }
        };
        let margin_ms = match self.options.time {
            TimeSource::Server => 0,
            TimeSource::Clock(_) => u64::try_from(self.options.clock_skew_margin.as_millis()).unwrap_or(u64::MAX),
        };
        invocation.arg(margin_ms).arg(checks.len()).arg(charges.len()).arg(refunds.len());
        let limit_args = |invocation: &mut redis::ScriptInvocation<'_>, limit: &Limit, cost: u64| {
            invocation
                .arg(limit.algorithm().name())
                .arg(limit.count())
                .arg(limit.period_ns())
                .arg(limit.burst())
                .arg(limit.slices())
                .arg(limit.emission_interval_ns())
                .arg(limit.tolerance_ns())
                .arg(cost);
        };
        for check in checks {
            limit_args(&mut invocation, check.limit, check.cost);
        }
        for charge in charges {
            limit_args(&mut invocation, charge.check.limit, charge.check.cost);
            invocation.arg(charge.age_ns);
        }
        for refund in refunds {
            limit_args(&mut invocation, refund.check.limit, refund.check.cost);
            invocation.arg(refund.at).arg(refund.decision.reset_after_ns);
        }
        if let Some(lease) = lease {
            invocation.arg(lease.lessee).arg(lease.lifetime_ms);
        }
        self.script_calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let call = async {
            match &self.connection {
                Connection::Single(c) => invocation.invoke_async::<Vec<i64>>(&mut c.clone()).await,
                Connection::Cluster(c) => invocation.invoke_async::<Vec<i64>>(&mut c.connection().await?).await,
            }
        };
        let reply = tokio::time::timeout(self.options.timeout, call)
            .await
            .map_err(|_| StoreError::Timeout(self.options.timeout))?
            .map_err(|e| script_error(&e, &keys))?;
        match lease {
            None => Ok((parse_reply(&reply, checks.len())?, None)),
            Some(_) => {
                let (reply, granted) = reply.split_at(reply.len().saturating_sub(2));
                let field = |v: i64| u64::try_from(v).map_err(|_| StoreError::Backend(format!("bad lease reply {v}")));
                let granted = match granted {
                    [units, lessees] => (field(*units)?, field(*lessees)?),
                    _ => return Err(StoreError::Backend("the script answered no lease".into())),
                };
                Ok((parse_reply(reply, checks.len())?, Some(granted)))
            }
        }
    }
}

/// One slot's share of a call: the indices of its checks in the call, and its charges.
struct Group<'a> {
    checks: Vec<usize>,
    charges: Vec<Charge<'a>>,
}

impl RedisStore {
    /// Records `charges` and decides `checks` all or nothing, whatever slots their keys are in:
    /// one script call when they share one; otherwise slot by slot, in order, and once a slot
    /// denies, what the slots before it admitted is refunded (exactly, unless something else was
    /// admitted there meanwhile: then it stays counted, an under-grant) and every check that did
    /// not block reports its state as a peek would. Charges are recorded in any case.
    async fn decide_across(&self, checks: &[Check<'_>], charges: &[Charge<'_>]) -> Result<Reply, StoreError> {
        if let Some(c) = checks.iter().find(|c| c.cost > c.limit.capacity()) {
            return Err(tollgate_core::Error::CostExceedsCapacity { cost: c.cost, capacity: c.limit.capacity() }.into());
        }
        let groups = self.groups(checks, charges)?;
        if groups.len() <= 1 {
            return self.call(checks, charges, &[]).await;
        }
        let mut decisions: Vec<Option<Decision>> = vec![None; checks.len()];
        let mut snapshots = vec![Snapshot::default(); checks.len()];
        let mut admitted: Vec<(Vec<usize>, u64)> = Vec::new();
        let mut now_ns = 0;
        let mut denied = false;
        for group in &groups {
            // After a denial, the remaining slots are only peeked (and charged).
            let sent: Vec<Check<'_>> =
                group.checks.iter().map(|&i| if denied { Check { cost: 0, ..checks[i] } } else { checks[i] }).collect();
            let reply = self.call(&sent, &group.charges, &[]).await?;
            now_ns = now_ns.max(reply.now_ns);
            // Each check keeps its own slot's instant (in its snapshot): a refund needs it.
            for (k, &i) in group.checks.iter().enumerate() {
                decisions[i] = Some(reply.decisions[k]);
                snapshots[i] = reply.snapshots[k];
            }
            if !denied && reply.decisions.iter().all(|d| d.allowed) {
                admitted.push((group.checks.clone(), reply.now_ns));
            } else if !denied {
                denied = true;
                // This slot decided all or nothing itself; its checks that did not block already
                // report as peeks.
            }
        }
        if denied {
            for (indices, at) in &admitted {
                let refunds: Vec<Refund<'_>> = indices
                    .iter()
                    .filter_map(|&i| decisions[i].map(|decision| Refund { check: checks[i], at: *at, decision }))
                    .collect();
                self.call(&[], &[], &refunds).await?;
                let peeks: Vec<Check<'_>> = indices.iter().map(|&i| Check { cost: 0, ..checks[i] }).collect();
                let reply = self.call(&peeks, &[], &[]).await?;
                for (k, &i) in indices.iter().enumerate() {
                    decisions[i] = Some(reply.decisions[k]);
                    snapshots[i] = reply.snapshots[k];
                }
            }
        }
        let decisions = decisions.into_iter().map(|d| d.ok_or(StoreError::NoChecks)).collect::<Result<_, _>>()?;
        Ok(Reply { decisions, snapshots, now_ns })
    }

    /// The call's checks and charges grouped by slot, in order of first appearance (one group on
    /// a single server).
    fn groups<'a>(&self, checks: &[Check<'_>], charges: &[Charge<'a>]) -> Result<Vec<Group<'a>>, StoreError> {
        if !matches!(self.connection, Connection::Cluster(_)) {
            return Ok(vec![Group { checks: (0..checks.len()).collect(), charges: charges.to_vec() }]);
        }
        let mut slots: Vec<redis::cluster_routing::Slot> = Vec::new();
        let mut groups: Vec<Group<'a>> = Vec::new();
        let group_of = |c: &Check<'_>, slots: &mut Vec<_>, groups: &mut Vec<Group<'a>>| -> Result<usize, StoreError> {
            let slot = redis::cluster_routing::Slot::for_key(self.state_key(c.scope, c.key, c.limit)?);
            Ok(slots.iter().position(|s| *s == slot).unwrap_or_else(|| {
                slots.push(slot);
                groups.push(Group { checks: Vec::new(), charges: Vec::new() });
                groups.len() - 1
            }))
        };
        for (i, check) in checks.iter().enumerate() {
            let g = group_of(check, &mut slots, &mut groups)?;
            groups[g].checks.push(i);
        }
        for charge in charges {
            let g = group_of(&charge.check, &mut slots, &mut groups)?;
            groups[g].charges.push(*charge);
        }
        Ok(groups)
    }
}

impl RedisStore {
    /// `items` grouped by the Redis Cluster slot of their check's key, groups in order of first
    /// appearance (one group on a single server).
    fn by_slot<T: Copy>(&self, items: &[T], check: impl Fn(&T) -> Check<'_>) -> Result<Vec<Vec<T>>, StoreError> {
        if !matches!(self.connection, Connection::Cluster(_)) {
            return Ok(vec![items.to_vec()]);
        }
        let mut groups: Vec<(redis::cluster_routing::Slot, Vec<T>)> = Vec::new();
        for item in items {
            let c = check(item);
            let slot = redis::cluster_routing::Slot::for_key(self.state_key(c.scope, c.key, c.limit)?);
            match groups.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, group)) => group.push(*item),
                None => groups.push((slot, vec![*item])),
            }
        }
        Ok(groups.into_iter().map(|(_, group)| group).collect())
    }
}

impl Store for RedisStore {
    /// One script call when every key shares a slot; see [`RedisStore::decide_across`] otherwise.
    async fn reserve(&self, checks: &[Check<'_>]) -> Result<Reserved, StoreError> {
        if checks.is_empty() {
            return Err(StoreError::NoChecks);
        }
        let reply = self.decide_across(checks, &[]).await?;
        let per_check = if reply.snapshots.iter().all(|s| s.at == reply.now_ns) {
            Vec::new()
        } else {
            reply.snapshots.iter().map(|s| s.at).collect()
        };
        Ok(Reserved { decisions: reply.decisions, at: reply.now_ns, per_check })
    }

    async fn refund(&self, refunds: &[Refund<'_>]) -> Result<(), StoreError> {
        let refunds: Vec<Refund<'_>> =
            refunds.iter().filter(|r| r.decision.allowed && r.check.cost > 0).copied().collect();
        for group in self.by_slot(&refunds, |r| r.check)? {
            self.call(&[], &[], &group).await?;
        }
        Ok(())
    }

    async fn reset(&self, scope: &str, key: &[u8], limit: &Limit) -> Result<(), StoreError> {
        let key = self.state_key(scope, key, limit)?;
        let call = async {
            let mut cmd = redis::cmd("DEL");
            cmd.arg(key.as_slice());
            self.connection.query::<i64>(&cmd).await
        };
        tokio::time::timeout(self.options.timeout, call)
            .await
            .map_err(|_| StoreError::Timeout(self.options.timeout))?
            .map_err(|e| backend(&e))?;
        Ok(())
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
            return Ok(Reply { decisions: Vec::new(), snapshots: Vec::new(), now_ns });
        }
        self.decide_across(checks, charges).await
    }

    async fn probe(&self) -> Result<(), StoreError> {
        let call = async { self.connection.query::<String>(&redis::cmd("PING")).await };
        tokio::time::timeout(self.options.timeout, call)
            .await
            .map_err(|_| StoreError::Timeout(self.options.timeout))?
            .map_err(|e| backend(&e))?;
        Ok(())
    }
}
