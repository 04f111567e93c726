//! Server configuration: listen addresses, the store, the failure policy, protocol bounds, and
//! the named limits of the TOML config file.
//!
//! ```toml
//! # tollgate.toml
//! [limits.api]              # used as `TG.LIMIT api KEY` or `{"limit_name": "api", ...}`
//! algorithm = "gcra"        # any of the seven; default gcra
//! limit = "100/1m"          # COUNT/PERIOD
//! burst = 20                # bucket family only; default: the count
//!
//! [limits.login]
//! algorithm = "sliding-log"
//! limit = "5/15m"
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;

use serde::Deserialize;
use tollgate_core::Limit;
pub use tollgate_store::memory::DEFAULT_MAX_KEYS;

/// Which store decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreConfig {
    /// The embedded in-memory store, bounded at `max_keys` keys per table.
    Memory {
        /// See `MemoryStoreBuilder::max_keys`.
        max_keys: usize,
    },
    /// One Redis server, e.g. `redis://127.0.0.1:6379`.
    Redis(String),
    /// A Redis Cluster, reached through any of these nodes.
    Cluster(Vec<String>),
}

impl StoreConfig {
    /// Parses `memory`, `redis://host:port[/db]` or `redis+cluster://host:port,host:port`.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text == "memory" {
            return Ok(StoreConfig::Memory { max_keys: tollgate_store::memory::DEFAULT_MAX_KEYS });
        }
        if let Some(nodes) = text.strip_prefix("redis+cluster://") {
            let nodes: Vec<String> =
                nodes.split(',').filter(|n| !n.is_empty()).map(|n| format!("redis://{n}")).collect();
            if nodes.is_empty() {
                return Err("redis+cluster:// needs at least one host:port".into());
            }
            return Ok(StoreConfig::Cluster(nodes));
        }
        if text.starts_with("redis://") || text.starts_with("rediss://") {
            return Ok(StoreConfig::Redis(text.to_string()));
        }
        Err(format!("unknown store {text:?}: use memory, redis://host:port or redis+cluster://host:port,host:port"))
    }
}

/// What a Redis-backed server answers while Redis fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnStoreError {
    /// Admit.
    Open,
    /// Deny.
    Closed,
    /// Decide in this process's memory (the default: a per-process limit stays in force).
    #[default]
    Local,
}

impl std::str::FromStr for OnStoreError {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "open" => Ok(OnStoreError::Open),
            "closed" => Ok(OnStoreError::Closed),
            "local" => Ok(OnStoreError::Local),
            _ => Err(format!("unknown policy {text:?}: use open, closed or local")),
        }
    }
}

/// Everything the server needs besides its listeners.
#[derive(Debug, Clone)]
pub struct Config {
    /// The store.
    pub store: StoreConfig,
    /// The failure policy for Redis stores.
    pub on_store_error: OnStoreError,
    /// Timeout of each Redis call.
    pub store_timeout: std::time::Duration,
    /// Named limits (`TG.LIMIT`, HTTP `limit_name`).
    pub limits: BTreeMap<String, Limit>,
    /// Largest RESP command accepted, in bytes (default 1 MiB).
    pub max_frame_bytes: usize,
    /// Most arguments in one RESP command (default 1,024).
    pub max_args: usize,
    /// Most simultaneous RESP connections (default 10,000).
    pub max_connections: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            store: StoreConfig::Memory { max_keys: tollgate_store::memory::DEFAULT_MAX_KEYS },
            on_store_error: OnStoreError::default(),
            store_timeout: std::time::Duration::from_millis(50),
            limits: BTreeMap::new(),
            max_frame_bytes: 1 << 20,
            max_args: 1024,
            max_connections: 10_000,
        }
    }
}

/// The TOML file's shape.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    limits: BTreeMap<String, LimitEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitEntry {
    #[serde(default)]
    algorithm: Option<String>,
    limit: String,
    burst: Option<u64>,
    slices: Option<u64>,
}

/// Reads named limits from a TOML file; errors name the file and the limit at fault.
pub fn load_limits(path: &Path) -> Result<BTreeMap<String, Limit>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    parse_limits(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Parses named limits from TOML text.
pub fn parse_limits(text: &str) -> Result<BTreeMap<String, Limit>, String> {
    let file: File = toml::from_str(text).map_err(|e| e.to_string())?;
    file.limits
        .into_iter()
        .map(|(name, entry)| {
            let limit = build(&entry).map_err(|e| format!("limit {name:?}: {e}"))?;
            Ok((name, limit))
        })
        .collect()
}

fn build(entry: &LimitEntry) -> Result<Limit, String> {
    Limit::from_parts(&entry.limit, entry.algorithm.as_deref(), entry.burst, entry.slices).map_err(|e| e.to_string())
}

/// Where the server listens.
#[derive(Debug, Clone, Copy)]
pub struct Addresses {
    /// RESP (default 127.0.0.1:6380).
    pub resp: SocketAddr,
    /// HTTP (default 127.0.0.1:8080).
    pub http: SocketAddr,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_named_limits_and_names_the_bad_one() {
        let limits = parse_limits("[limits.api]\nlimit = \"100/1m\"\nburst = 20\n[limits.login]\nalgorithm = \"sliding-log\"\nlimit = \"5/15m\"\n").unwrap();
        assert_eq!(limits["api"].burst(), 20);
        assert_eq!(limits["login"].algorithm(), tollgate_core::Algorithm::SlidingLog);
        let err = parse_limits("[limits.bad]\nlimit = \"0/s\"\n").unwrap_err();
        assert!(err.contains("limit \"bad\"") && err.contains("count must be at least 1"), "{err}");
        let err = parse_limits("[limits.x]\nlimit = \"1/s\"\nburts = 3\n").unwrap_err();
        assert!(err.contains("burts"), "{err}");
    }

    #[test]
    fn parses_stores() {
        assert_eq!(StoreConfig::parse("redis://h:1").unwrap(), StoreConfig::Redis("redis://h:1".into()));
        assert_eq!(
            StoreConfig::parse("redis+cluster://a:1,b:2").unwrap(),
            StoreConfig::Cluster(vec!["redis://a:1".into(), "redis://b:2".into()])
        );
        assert!(StoreConfig::parse("mongodb://x").is_err());
    }
}
