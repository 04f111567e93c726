//! Real Redis topologies for tests (features `testkit` + `redis`): a Redis Cluster (primaries,
//! optionally with replicas, plain or TLS) and a Sentinel group (a primary, replicas, three
//! Sentinels). Made of [`RedisServer`]s, stopped on drop.

use std::process::Command;
use std::time::{Duration, Instant};

use super::redis_server::{RedisServer, ServerConfig, ServerTls};

/// How to start a [`RedisCluster`].
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// Primaries (at least 3, as `redis-cli --cluster create` requires).
    pub primaries: usize,
    /// Replicas per primary.
    pub replicas: usize,
    /// `cluster-node-timeout` (ms): how long a primary may not answer before its replica takes over.
    pub node_timeout_ms: u64,
    /// TLS on every node and on the cluster bus.
    pub tls: Option<ServerTls>,
    /// Further configuration lines for every node.
    pub lines: Vec<String>,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig { primaries: 3, replicas: 0, node_timeout_ms: 2000, tls: None, lines: Vec::new() }
    }
}

/// A Redis Cluster of real servers.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Three primaries, no replicas.
    #[must_use]
    pub fn start() -> Self {
        Self::start_with(ClusterConfig::default())
    }

    /// Starts the servers and joins them with `redis-cli --cluster create`; returns once every
    /// node reports `cluster_state:ok` and knows every other node.
    #[must_use]
    pub fn start_with(config: ClusterConfig) -> Self {
        let server = ServerConfig {
            cluster_node_timeout_ms: Some(config.node_timeout_ms),
            tls: config.tls.clone(),
            lines: config.lines.clone(),
            ..ServerConfig::default()
        };
        let count = config.primaries * (1 + config.replicas);
        let nodes: Vec<RedisServer> = (0..count).map(|_| RedisServer::start_with(server.clone())).collect();
        let addresses: Vec<String> = nodes.iter().map(RedisServer::address).collect();
        let mut tls_args = nodes[0].cli_args();
        tls_args.drain(..4); // -h HOST -p PORT
        let output = Command::new("redis-cli")
            .args(&tls_args)
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", &config.replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("redis-cli runs");
        assert!(output.status.success(), "cluster create failed: {}", String::from_utf8_lossy(&output.stdout));
        let cluster = RedisCluster { nodes };
        cluster.wait_healthy(Duration::from_secs(30));
        cluster
    }

    /// Waits until every running node says `cluster_state:ok` and flags no node as failing or
    /// in handshake, and every replica is in sync with its primary; panics after `within`.
    pub fn wait_healthy(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let healthy = self.nodes.iter().filter(|n| n.pid().is_some()).all(|node| {
                let nodes = node.cli(&["CLUSTER", "NODES"]);
                node.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok")
                    && nodes.lines().count() == self.nodes.len()
                    && !nodes.contains("fail")
                    && !nodes.contains("handshake")
                    && {
                        let replication = node.cli(&["INFO", "replication"]);
                        !replication.contains("role:slave") || replication.contains("master_link_status:up")
                    }
            });
            if healthy {
                return;
            }
            assert!(Instant::now() < deadline, "the cluster did not become healthy within {within:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The nodes' URLs.
    #[must_use]
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The nodes.
    #[must_use]
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The nodes, to kill or restart one.
    pub fn nodes_mut(&mut self) -> &mut [RedisServer] {
        &mut self.nodes
    }

    /// The index of the node that serves `slot` as a primary, as the first running node that
    /// answers says (None if no running node knows one).
    #[must_use]
    pub fn primary_of(&self, slot: u16) -> Option<usize> {
        let view = self.nodes.iter().filter(|n| n.pid().is_some()).map(|n| n.cli(&["CLUSTER", "NODES"])).next()?;
        for line in view.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 8 || !fields[2].contains("master") || fields[2].contains("fail") {
                continue;
            }
            let owns = fields[8..].iter().any(|range| {
                let (start, end) = range.split_once('-').unwrap_or((range, range));
                matches!((start.parse::<u16>(), end.parse::<u16>()), (Ok(s), Ok(e)) if s <= slot && slot <= e)
            });
            if owns {
                let address = fields[1].split('@').next()?;
                return self.nodes.iter().position(|n| n.address() == address);
            }
        }
        None
    }

    /// The hash slot of `key` (Redis's own answer).
    #[must_use]
    pub fn slot_of(&self, key: &[u8]) -> u16 {
        let node = self.nodes.iter().find(|n| n.pid().is_some()).expect("a running node");
        node.cli(&["CLUSTER", "KEYSLOT", &String::from_utf8_lossy(key)]).trim().parse().expect("CLUSTER KEYSLOT")
    }

    /// Moves `slot` with its keys from its primary to the primary `to`, as `redis-cli --cluster
    /// reshard` does: IMPORTING / MIGRATING, then the keys in batches of `batch` with a pause of
    /// `pause` between batches (while clients keep using the slot), then the new owner announced.
    pub fn migrate_slot(&self, slot: u16, to: usize, batch: usize, pause: Duration) {
        let from = self.primary_of(slot).expect("the slot has a primary");
        let id = |i: usize| self.nodes[i].cli(&["CLUSTER", "MYID"]).trim().to_string();
        let (from_id, to_id) = (id(from), id(to));
        let slot_text = slot.to_string();
        assert_eq!(self.nodes[to].cli(&["CLUSTER", "SETSLOT", &slot_text, "IMPORTING", &from_id]).trim(), "OK");
        assert_eq!(self.nodes[from].cli(&["CLUSTER", "SETSLOT", &slot_text, "MIGRATING", &to_id]).trim(), "OK");
        let target_port = self.nodes[to].port().to_string();
        loop {
            let keys = self.nodes[from].cli(&["CLUSTER", "GETKEYSINSLOT", &slot_text, &batch.to_string()]);
            let keys: Vec<&str> = keys.lines().filter(|k| !k.is_empty()).collect();
            if keys.is_empty() {
                break;
            }
            let mut args = vec!["MIGRATE", "127.0.0.1", &target_port, "", "0", "5000", "KEYS"];
            args.extend(keys.iter().copied());
            let reply = self.nodes[from].cli(&args);
            assert!(reply.trim() == "OK" || reply.trim() == "NOKEY", "MIGRATE: {reply}");
            std::thread::sleep(pause);
        }
        // The new owner first, then the old one, then the other primaries (replicas follow theirs).
        let others = (0..self.nodes.len()).filter(|&i| i != to && i != from);
        for i in [to, from].into_iter().chain(others) {
            let node = &self.nodes[i];
            if node.pid().is_none() || !node.cli(&["ROLE"]).starts_with("master") {
                continue;
            }
            let reply = node.cli(&["CLUSTER", "SETSLOT", &slot_text, "NODE", &to_id]);
            assert_eq!(reply.trim(), "OK", "SETSLOT NODE on node {i}");
        }
    }
}

/// How to start a [`SentinelGroup`].
#[derive(Debug, Clone)]
pub struct SentinelConfig {
    /// The name the Sentinels monitor the primary under.
    pub master_name: String,
    /// Replicas of the primary.
    pub replicas: usize,
    /// `down-after-milliseconds`: how long the primary may not answer before a failover starts.
    pub down_after_ms: u64,
    /// TLS on the data servers and the Sentinels.
    pub tls: Option<ServerTls>,
    /// Further configuration lines for the data servers (an ACL user, say).
    pub lines: Vec<String>,
    /// Lines for the Sentinels (`sentinel auth-user …` when the primary needs it).
    pub sentinel_lines: Vec<String>,
    /// A password the Sentinels require of their clients (and of each other).
    pub sentinel_password: Option<String>,
}

impl Default for SentinelConfig {
    fn default() -> Self {
        SentinelConfig {
            master_name: "tollgate".into(),
            replicas: 1,
            down_after_ms: 1000,
            tls: None,
            lines: Vec::new(),
            sentinel_lines: Vec::new(),
            sentinel_password: None,
        }
    }
}

/// A primary, its replicas and three Sentinels monitoring it (quorum 2).
#[derive(Debug)]
pub struct SentinelGroup {
    /// The data servers: the first started as the primary.
    pub servers: Vec<RedisServer>,
    /// The three Sentinels.
    pub sentinels: Vec<RedisServer>,
    config: SentinelConfig,
}

impl SentinelGroup {
    /// Starts the primary, its replicas and the Sentinels, without waiting for them.
    fn start_unsettled(config: SentinelConfig) -> Self {
        let data = ServerConfig { tls: config.tls.clone(), lines: config.lines.clone(), ..ServerConfig::default() };
        let primary = RedisServer::start_with(data.clone());
        let mut servers = vec![primary];
        for _ in 0..config.replicas {
            let mut replica = data.clone();
            replica.lines.push(format!("replicaof 127.0.0.1 {}", servers[0].port()));
            servers.push(RedisServer::start_with(replica));
        }
        let mut lines = vec![
            format!("sentinel monitor {} 127.0.0.1 {} 2", config.master_name, servers[0].port()),
            format!("sentinel down-after-milliseconds {} {}", config.master_name, config.down_after_ms),
            format!("sentinel failover-timeout {} 10000", config.master_name),
            format!("sentinel parallel-syncs {} 1", config.master_name),
        ];
        lines.extend(config.sentinel_lines.iter().cloned());
        if let Some(password) = &config.sentinel_password {
            lines.push(format!("requirepass {password}"));
            lines.push(format!("sentinel sentinel-pass {password}"));
        }
        let sentinel = ServerConfig {
            tls: config.tls.clone(),
            sentinel: true,
            lines,
            cli_password: config.sentinel_password.clone(),
            ..ServerConfig::default()
        };
        let sentinels = (0..3).map(|_| RedisServer::start_with(sentinel.clone())).collect();
        SentinelGroup { servers, sentinels, config }
    }

    /// Starts a group as `config` says and waits until it has settled: the replicas in sync, each
    /// Sentinel knowing the replicas and the other Sentinels. A group that has not
    /// settled within 30 s (it settles in 2 s on an idle machine; a failover the Sentinels start
    /// on a loaded machine can keep it unsettled much longer) is stopped and started afresh, at
    /// most twice, with what it looked like printed: the tests measure tollgate, not the start.
    #[must_use]
    pub fn start(config: SentinelConfig) -> Self {
        let mut attempt = 1;
        loop {
            let group = Self::start_unsettled(config.clone());
            match group.settled_within(Duration::from_secs(30)) {
                Ok(()) => return group,
                Err(state) if attempt < 3 => {
                    eprintln!(
                        "the Sentinel group did not settle within 30 s (attempt {attempt}), starting it again: {state}"
                    );
                    attempt += 1;
                }
                Err(state) => panic!("the Sentinel group did not settle within 30 s, three times: {state}"),
            }
        }
    }

    /// Waits until every running server but the primary the Sentinels name is a replica in sync,
    /// and every Sentinel knows the replicas and the two other Sentinels; panics with what each
    /// server and Sentinel says if that takes longer than `within`.
    pub fn wait_settled(&self, within: Duration) {
        if let Err(state) = self.settled_within(within) {
            panic!("the Sentinel group did not settle within {within:?}: {state}");
        }
    }

    /// `Err` with what each server and Sentinel says if the group has not settled within `within`.
    fn settled_within(&self, within: Duration) -> Result<(), String> {
        let deadline = Instant::now() + within;
        let name = &self.config.master_name;
        loop {
            let primary = self.primary();
            let replicas_up = primary.is_some()
                && (0..self.servers.len())
                    .filter(|&i| Some(i) != primary && self.servers[i].pid().is_some())
                    .all(|i| self.servers[i].cli(&["INFO", "replication"]).contains("master_link_status:up"));
            let sentinels_know = self.sentinels.iter().all(|s| {
                let master = s.cli(&["SENTINEL", "MASTER", name]);
                let field = |f: &str| {
                    let lines: Vec<&str> = master.lines().collect();
                    lines
                        .iter()
                        .position(|l| l.trim() == f)
                        .and_then(|i| lines.get(i + 1))
                        .map(|v| v.trim().to_string())
                };
                field("num-slaves").is_some_and(|n| n == self.config.replicas.to_string())
                    && field("num-other-sentinels").is_some_and(|n| n == "2")
            });
            if replicas_up && sentinels_know {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(self.describe());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// What each server and Sentinel says of the group, for a failure message.
    fn describe(&self) -> String {
        let mut parts = Vec::new();
        for (i, server) in self.servers.iter().enumerate() {
            if server.pid().is_none() {
                parts.push(format!("server {i} (port {}) down", server.port()));
                continue;
            }
            let info = server.cli(&["INFO", "replication"]);
            let fields: Vec<&str> = info
                .lines()
                .map(str::trim)
                .filter(|l| {
                    ["role:", "master_link_status:", "connected_slaves:", "master_port:"]
                        .iter()
                        .any(|f| l.starts_with(f))
                })
                .collect();
            parts.push(format!("server {i} (port {}): {}", server.port(), fields.join(" ")));
        }
        for (i, sentinel) in self.sentinels.iter().enumerate() {
            let master = sentinel.cli(&["SENTINEL", "MASTER", &self.config.master_name]);
            let lines: Vec<&str> = master.lines().map(str::trim).collect();
            let field =
                |f: &str| lines.iter().position(|l| *l == f).and_then(|i| lines.get(i + 1)).copied().unwrap_or("?");
            parts.push(format!(
                "sentinel {i} (port {}): port {} flags {} num-slaves {} num-other-sentinels {}",
                sentinel.port(),
                field("port"),
                field("flags"),
                field("num-slaves"),
                field("num-other-sentinels")
            ));
        }
        parts.join("; ")
    }

    /// The Sentinels' `host:port` list, for a `redis+sentinel://` URL.
    #[must_use]
    pub fn sentinel_addresses(&self) -> String {
        let host = if self.config.tls.is_some() { "localhost" } else { "127.0.0.1" };
        self.sentinels.iter().map(|s| format!("{host}:{}", s.port())).collect::<Vec<_>>().join(",")
    }

    /// The index in `servers` of the primary the Sentinels name now.
    #[must_use]
    pub fn primary(&self) -> Option<usize> {
        let reply = self
            .sentinels
            .iter()
            .map(|s| s.cli(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", &self.config.master_name]))
            .next()?;
        let port: u16 = reply.lines().nth(1)?.trim().parse().ok()?;
        self.servers.iter().position(|s| s.port() == port)
    }
}
