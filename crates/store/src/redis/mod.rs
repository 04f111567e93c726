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
//!   and computes around "now" so that every value it handles is exact. The cost: the period and
//!   `burst * T` must be below 2^52 ns (52 days) on Redis.
//! - **Bounded waits.** Each call has a timeout (default 50 ms); the connection is multiplexed
//!   (concurrent calls are pipelined automatically) and reconnects by itself.

mod keys;

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use tollgate_core::{Clock, Decision, Limit};

use crate::{Check, Store, StoreError};

/// The longest period or `burst * T` the script computes exactly: 2^52 ns.
pub const MAX_DURATION_NS: u64 = 1 << 52;

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
    /// Prefix of every key (default `tollgate`).
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
    Cluster(ClusterConnection),
}

/// A [`Store`] on Redis or Redis Cluster.
#[derive(Clone)]
pub struct RedisStore {
    connection: Connection,
    options: RedisOptions,
    script: Arc<redis::Script>,
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

fn backend(error: &redis::RedisError) -> StoreError {
    StoreError::Backend(error.to_string())
}

impl RedisStore {
    /// A store on the Redis server at `url` (`redis://host:port/db`). Returns at once: the
    /// connection is made on first use and remade after failures, so a store can be created
    /// while Redis is down.
    pub fn open(url: &str, options: RedisOptions) -> Result<Self, StoreError> {
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
    pub async fn open_cluster(nodes: &[String], options: RedisOptions) -> Result<Self, StoreError> {
        let client = redis::cluster::ClusterClientBuilder::new(nodes.to_vec())
            .connection_timeout(options.timeout)
            .response_timeout(options.timeout)
            .retries(2)
            .min_retry_wait(10)
            .max_retry_wait(100)
            .build()
            .map_err(|e| backend(&e))?;
        let connection = client.get_async_connection().await.map_err(|e| backend(&e))?;
        Ok(RedisStore::with(Connection::Cluster(connection), options))
    }

    fn with(connection: Connection, options: RedisOptions) -> Self {
        RedisStore { connection, options, script: Arc::new(redis::Script::new(include_str!("decide.lua"))) }
    }

    /// This store's connection with other options (another prefix, clock or timeout).
    #[must_use]
    pub fn with_options(&self, options: RedisOptions) -> Self {
        RedisStore { connection: self.connection.clone(), options, script: self.script.clone() }
    }

    /// The Redis key that holds `key`'s state under `limit` (see the key scheme in `keys`).
    #[must_use]
    pub fn state_key(&self, key: &str, limit: &Limit) -> String {
        keys::state_key(&self.options.prefix, limit.algorithm(), key)
    }

    /// Decides `checks` in one script call.
    async fn decide(&self, checks: &[Check<'_>]) -> Result<Vec<Decision>, StoreError> {
        if checks.is_empty() {
            return Err(StoreError::NoChecks);
        }
        let keys: Vec<String> = checks.iter().map(|c| self.state_key(c.key, c.limit)).collect();
        if matches!(self.connection, Connection::Cluster(_)) {
            let slot = redis::cluster_routing::Slot::for_key(&keys[0]);
            if keys.iter().any(|k| redis::cluster_routing::Slot::for_key(k) != slot) {
                return Err(StoreError::CrossSlot);
            }
        }
        let mut invocation = self.script.prepare_invoke();
        for key in &keys {
            invocation.key(key);
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
        invocation.arg(margin_ms).arg(checks.len());
        for check in checks {
            let limit = check.limit;
            check_fits(limit, check.cost)?;
            invocation
                .arg(limit.algorithm().name())
                .arg(limit.count())
                .arg(limit.period_ns())
                .arg(limit.burst())
                .arg(limit.slices())
                .arg(limit.emission_interval_ns())
                .arg(limit.tolerance_ns())
                .arg(check.cost);
        }
        let call = async {
            match &self.connection {
                Connection::Single(c) => invocation.invoke_async::<Vec<i64>>(&mut c.clone()).await,
                Connection::Cluster(c) => invocation.invoke_async::<Vec<i64>>(&mut c.clone()).await,
            }
        };
        let reply = tokio::time::timeout(self.options.timeout, call)
            .await
            .map_err(|_| StoreError::Timeout(self.options.timeout))?
            .map_err(|e| script_error(&e, &keys))?;
        decisions(&reply, checks.len())
    }
}

/// Refuses what the script cannot decide exactly, before any round trip.
fn check_fits(limit: &Limit, cost: u64) -> Result<(), StoreError> {
    if cost > limit.capacity() {
        return Err(tollgate_core::Error::CostExceedsCapacity { cost, capacity: limit.capacity() }.into());
    }
    if limit.period_ns() >= MAX_DURATION_NS || limit.tolerance_ns() >= MAX_DURATION_NS {
        return Err(StoreError::Unsupported(format!(
            "{limit}: the Redis store computes periods and burst × emission interval below 2^52 ns (52 days)"
        )));
    }
    Ok(())
}

fn script_error(error: &redis::RedisError, keys: &[String]) -> StoreError {
    match error.code() {
        Some("WRONGTYPE") => StoreError::BadState(format!(
            "one of {keys:?} holds a Redis type tollgate does not write (another program uses the key)"
        )),
        Some("TOLLGATE_BADSTATE") => StoreError::BadState(error.detail().unwrap_or("").to_string()),
        _ if error.to_string().contains("TOLLGATE_BADSTATE") => StoreError::BadState(error.to_string()),
        _ => backend(error),
    }
}

fn decisions(reply: &[i64], n: usize) -> Result<Vec<Decision>, StoreError> {
    if reply.len() != 5 * n {
        return Err(StoreError::Backend(format!("the script answered {} values for {n} checks", reply.len())));
    }
    let field = |v: i64| u64::try_from(v).map_err(|_| StoreError::Backend(format!("negative value {v} in a decision")));
    reply
        .chunks_exact(5)
        .map(|d| {
            Ok(Decision {
                allowed: d[0] == 1,
                limit: field(d[1])?,
                remaining: field(d[2])?,
                retry_after_ns: field(d[3])?,
                reset_after_ns: field(d[4])?,
            })
        })
        .collect()
}

impl Store for RedisStore {
    async fn check(&self, key: &str, limit: &Limit, cost: u64) -> Result<Decision, StoreError> {
        let mut decisions = self.decide(&[Check { key, limit, cost }]).await?;
        Ok(decisions.remove(0))
    }

    async fn check_all(&self, checks: &[Check<'_>]) -> Result<Vec<Decision>, StoreError> {
        self.decide(checks).await
    }

    async fn reset(&self, key: &str, limit: &Limit) -> Result<(), StoreError> {
        let key = self.state_key(key, limit);
        let call = async {
            let mut cmd = redis::cmd("DEL");
            cmd.arg(&key);
            match &self.connection {
                Connection::Single(c) => cmd.query_async::<i64>(&mut c.clone()).await,
                Connection::Cluster(c) => cmd.query_async::<i64>(&mut c.clone()).await,
            }
        };
        tokio::time::timeout(self.options.timeout, call)
            .await
            .map_err(|_| StoreError::Timeout(self.options.timeout))?
            .map_err(|e| backend(&e))?;
        Ok(())
    }
}
