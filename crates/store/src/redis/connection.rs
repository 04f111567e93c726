//! The servers behind a [`RedisStore`](super::RedisStore), behind one interface whatever the
//! topology: one server, a Redis Cluster (calls routed by slot, see `cluster.rs`) or the primary
//! of a Sentinel group (see `sentinel.rs`). Also the probe (is anything answering?) and the
//! diagnosis (what exactly fails, per server, in tollgate's words).

use std::sync::Arc;
use std::time::Duration;

use redis::{Cmd, RedisError, Value};

use super::cluster::Cluster;
use super::keys;
use super::node::{Node, Settings};
use super::program::Script;
use super::sentinel::Sentinel;
use super::target::{RedisTarget, Topology};
use crate::StoreError;
use crate::remote::Domain;

/// The topology, connected.
#[derive(Clone)]
pub(super) enum Connection {
    Server(Arc<Node>),
    Cluster(Arc<Cluster>),
    Sentinel(Arc<Sentinel>),
}

/// A failed call: the driver's error, and the server it came from when one was reached.
pub(super) type Failure = (RedisError, Option<Arc<Node>>);

impl Connection {
    /// Connects to `target`'s servers, each call bounded by `timeout`; returns at once (every
    /// connection is made on first use).
    pub(super) fn open(target: &RedisTarget, timeout: Duration) -> Result<Self, StoreError> {
        let settings = Arc::new(Settings::data(target, timeout));
        let failed = |e: RedisError| StoreError::Backend(e.to_string());
        Ok(match &target.topology {
            Topology::Server(address) => Connection::Server(Node::open(address.clone(), settings).map_err(failed)?),
            Topology::Cluster(seeds) => Connection::Cluster(Arc::new(Cluster::new(seeds.clone(), settings))),
            Topology::Sentinel { sentinels, master } => {
                let sentinel_settings = Arc::new(Settings::sentinels(target, timeout));
                Connection::Sentinel(Arc::new(
                    Sentinel::new(sentinels.clone(), master.clone(), settings, sentinel_settings).map_err(failed)?,
                ))
            }
        })
    }

    /// `server`, `cluster` or `sentinel`.
    pub(super) fn kind(&self) -> &'static str {
        match self {
            Connection::Server(_) => "server",
            Connection::Cluster(_) => "cluster",
            Connection::Sentinel(_) => "sentinel",
        }
    }

    /// Runs `cmd`, whose keys all share `key`'s slot, where that slot is served.
    pub(super) async fn run(&self, key: &[u8], cmd: &Cmd, script: Option<&Script>) -> Result<Value, Failure> {
        match self {
            Connection::Server(node) => node.run(cmd, script, false).await.map_err(|e| (e, Some(node.clone()))),
            Connection::Cluster(cluster) => cluster.run(keys::slot(key), cmd, script).await,
            Connection::Sentinel(sentinel) => sentinel.run(cmd, script).await,
        }
    }

    /// The server that `key`'s calls go to now (`""` while a cluster's map or the Sentinels'
    /// primary is not known yet).
    pub(super) fn domain(&self, key: &[u8]) -> Domain {
        let node = match self {
            Connection::Server(node) => Some(node.clone()),
            Connection::Cluster(cluster) => cluster.owner(keys::slot(key)),
            Connection::Sentinel(sentinel) => sentinel.primary(),
        };
        node.map_or_else(|| Domain::from(""), |n| n.domain.clone())
    }

    /// Whether the server `domain` answers a `PING` now, after the topology is read again;
    /// `Ok(false)` if the topology no longer has it as a primary. `""` (no server known yet):
    /// whether any primary answers.
    pub(super) async fn probe_domain(&self, domain: &Domain) -> Result<bool, StoreError> {
        if domain.is_empty() {
            return self.probe().await.map(|()| true);
        }
        let node = match self {
            Connection::Server(node) => Some(node.clone()),
            Connection::Cluster(cluster) => {
                cluster.refresh(false).await.map_err(|e| StoreError::Backend(e.to_string()))?;
                cluster.primaries().into_iter().find(|n| n.domain == *domain)
            }
            Connection::Sentinel(sentinel) => {
                sentinel.refresh(false).await.map_err(|e| StoreError::Backend(e.to_string()))?;
                sentinel.primary().filter(|n| n.domain == *domain)
            }
        };
        let Some(node) = node else { return Ok(false) };
        if matches!(self, Connection::Cluster(_)) {
            // A cluster node that answers may still refuse its keys (CLUSTERDOWN while it rejoins,
            // or while the cluster lacks a slot): it serves once it says its cluster is ok.
            let mut info = redis::cmd("CLUSTER");
            info.arg("INFO");
            return match node.query::<String>(&info).await {
                Ok(info) if info.contains("cluster_state:ok") => Ok(true),
                Ok(_) => Err(StoreError::Backend(format!(
                    "{}: it answers, but does not serve its slots yet (its cluster_state is not ok)",
                    node.address
                ))),
                Err(error) => Err(StoreError::Backend(node.explain(&error))),
            };
        }
        match node.query::<String>(&redis::cmd("PING")).await {
            Ok(_) => Ok(true),
            Err(error) => Err(StoreError::Backend(node.explain(&error))),
        }
    }

    /// Whether Redis answers now: the topology is read again (a cluster's slot map, the
    /// Sentinels' primary) and a `PING` answered (by any primary of a cluster); a cluster whose
    /// map lacks slots does not (its keys there fail), and the error says how many it covers.
    pub(super) async fn probe(&self) -> Result<(), StoreError> {
        let primaries = match self {
            Connection::Server(node) => vec![node.clone()],
            Connection::Cluster(cluster) => {
                cluster.refresh(false).await.map_err(|e| StoreError::Backend(e.to_string()))?;
                if let Some(problem) = cluster.coverage_problem() {
                    return Err(StoreError::Backend(problem));
                }
                cluster.primaries()
            }
            Connection::Sentinel(sentinel) => {
                sentinel.refresh(false).await.map_err(|e| StoreError::Backend(e.to_string()))?;
                sentinel.primary().into_iter().collect()
            }
        };
        let mut last = StoreError::Backend("no primary is known".into());
        for node in primaries {
            match node.query::<String>(&redis::cmd("PING")).await {
                Ok(_) => return Ok(()),
                Err(error) => last = StoreError::Backend(node.explain(&error)),
            }
        }
        Err(last)
    }

    /// What fails, in tollgate's words, if anything does: each server calls go to is tried on a
    /// connection of its own (every primary of a cluster; the Sentinels, then their primary); a
    /// cluster's map that lacks slots is said first.
    pub(super) async fn diagnose(&self) -> Option<String> {
        match self {
            Connection::Server(node) => node.diagnose().await,
            Connection::Cluster(cluster) => {
                if let Err(error) = cluster.refresh(false).await {
                    return Some(error.to_string());
                }
                if let Some(problem) = cluster.coverage_problem() {
                    return Some(problem);
                }
                for node in cluster.primaries() {
                    if let Some(problem) = node.diagnose().await {
                        return Some(problem);
                    }
                }
                None
            }
            Connection::Sentinel(sentinel) => {
                if let Err(error) = sentinel.refresh(false).await {
                    return Some(error.to_string());
                }
                match sentinel.primary() {
                    Some(node) => node.diagnose().await,
                    None => Some("no primary found through the Sentinels".into()),
                }
            }
        }
    }
}
