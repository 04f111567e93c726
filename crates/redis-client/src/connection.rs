//! The servers behind one [`RedisTarget`], behind one interface whatever the topology: one server, a Redis Cluster (calls routed by slot, see `cluster.rs`) or the primary
//! of a Sentinel group (see `sentinel.rs`). Also the probe (is anything answering?) and the
//! diagnosis (what exactly fails, per server, in tollgate's words).

use std::sync::Arc;
use std::time::Duration;

use redis::{Cmd, RedisError, Value};

use crate::cluster::Cluster;
use crate::error::{CallError, Error};
use crate::node::{Node, Settings};
use crate::script::Script;
use crate::sentinel::Sentinel;
use crate::slot::slot;
use crate::target::{RedisTarget, Topology};

/// The topology, connected: cheap to clone, every clone on the same connections.
#[derive(Clone)]
pub struct Connection(Kind);

#[derive(Clone)]
enum Kind {
    Server(Arc<Node>),
    Cluster(Arc<Cluster>),
    Sentinel(Arc<Sentinel>),
}

impl Connection {
    /// Connects to `target`'s servers, each call bounded by `timeout`; returns at once (every
    /// connection is made on first use).
    pub fn open(target: &RedisTarget, timeout: Duration) -> Result<Self, Error> {
        let settings = Arc::new(Settings::data(target, timeout));
        let failed = |e: RedisError| Error::Settings(e.to_string());
        Ok(Connection(match &target.topology {
            Topology::Server(address) => Kind::Server(Node::open(address.clone(), settings).map_err(failed)?),
            Topology::Cluster(seeds) => Kind::Cluster(Arc::new(Cluster::new(seeds.clone(), settings))),
            Topology::Sentinel { sentinels, master } => {
                let sentinel_settings = Arc::new(Settings::sentinels(target, timeout));
                Kind::Sentinel(Arc::new(
                    Sentinel::new(sentinels.clone(), master.clone(), settings, sentinel_settings).map_err(failed)?,
                ))
            }
        }))
    }

    /// `server`, `cluster` or `sentinel`.
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match &self.0 {
            Kind::Server(_) => "server",
            Kind::Cluster(_) => "cluster",
            Kind::Sentinel(_) => "sentinel",
        }
    }

    /// Whether this is a Redis Cluster (one call's keys must then share a slot).
    #[must_use]
    pub fn is_cluster(&self) -> bool {
        matches!(self.0, Kind::Cluster(_))
    }

    /// Runs `cmd`, whose keys all share `key`'s slot, where that slot is served. With `script`,
    /// `cmd` is the script's `FCALL` (or its native command's call), sent in the form the server
    /// allows (see `script.rs`). A call is sent at most once to a server that may run it.
    pub async fn run(&self, key: &[u8], cmd: &Cmd, script: Option<&Script>) -> Result<Value, CallError> {
        let failed = match &self.0 {
            Kind::Server(node) => node.run(cmd, script, false).await.map_err(|e| (e, Some(node.clone()))),
            Kind::Cluster(cluster) => cluster.run(slot(key), cmd, script).await,
            Kind::Sentinel(sentinel) => sentinel.run(cmd, script).await,
        };
        failed.map_err(|(error, server)| CallError::new(error, server))
    }

    /// The server that `key`'s calls go to now, as its address (`""` while a cluster's map or
    /// the Sentinels' primary is not known yet): a fault domain of the failure policy.
    #[must_use]
    pub fn domain(&self, key: &[u8]) -> Arc<str> {
        let node = match &self.0 {
            Kind::Server(node) => Some(node.clone()),
            Kind::Cluster(cluster) => cluster.owner(slot(key)),
            Kind::Sentinel(sentinel) => sentinel.primary(),
        };
        node.map_or_else(|| Arc::from(""), |n| n.domain.clone())
    }

    /// Whether the server `domain` answers a `PING` now, after the topology is read again;
    /// `Ok(false)` if the topology no longer has it as a primary. `""` (no server known yet):
    /// whether any primary answers.
    pub async fn probe_domain(&self, domain: &str) -> Result<bool, Error> {
        if domain.is_empty() {
            return self.probe().await.map(|()| true);
        }
        let node = match &self.0 {
            Kind::Server(node) => Some(node.clone()),
            Kind::Cluster(cluster) => {
                cluster.refresh(false).await.map_err(|e| Error::Unavailable(e.to_string()))?;
                cluster.primaries().into_iter().find(|n| *n.domain == *domain)
            }
            Kind::Sentinel(sentinel) => {
                sentinel.refresh(false).await.map_err(|e| Error::Unavailable(e.to_string()))?;
                sentinel.primary().filter(|n| *n.domain == *domain)
            }
        };
        let Some(node) = node else { return Ok(false) };
        if self.is_cluster() {
            // A cluster node that answers may still refuse its keys (CLUSTERDOWN while it rejoins,
            // or while the cluster lacks a slot): it serves once it says its cluster is ok.
            let mut info = redis::cmd("CLUSTER");
            info.arg("INFO");
            return match node.query::<String>(&info).await {
                Ok(info) if info.contains("cluster_state:ok") => Ok(true),
                Ok(_) => Err(Error::Unavailable(format!(
                    "{}: it answers, but does not serve its slots yet (its cluster_state is not ok)",
                    node.address
                ))),
                Err(error) => Err(Error::Unavailable(node.explain(&error))),
            };
        }
        match node.query::<String>(&redis::cmd("PING")).await {
            Ok(_) => Ok(true),
            Err(error) => Err(Error::Unavailable(node.explain(&error))),
        }
    }

    /// Whether Redis answers now: the topology is read again (a cluster's slot map, the
    /// Sentinels' primary) and a `PING` answered (by any primary of a cluster); a cluster whose
    /// map lacks slots does not (its keys there fail), and the error says how many it covers.
    pub async fn probe(&self) -> Result<(), Error> {
        let primaries = match &self.0 {
            Kind::Server(node) => vec![node.clone()],
            Kind::Cluster(cluster) => {
                cluster.refresh(false).await.map_err(|e| Error::Unavailable(e.to_string()))?;
                if let Some(problem) = cluster.coverage_problem() {
                    return Err(Error::Unavailable(problem));
                }
                cluster.primaries()
            }
            Kind::Sentinel(sentinel) => {
                sentinel.refresh(false).await.map_err(|e| Error::Unavailable(e.to_string()))?;
                sentinel.primary().into_iter().collect()
            }
        };
        let mut last = Error::Unavailable("no primary is known".into());
        for node in primaries {
            match node.query::<String>(&redis::cmd("PING")).await {
                Ok(_) => return Ok(()),
                Err(error) => last = Error::Unavailable(node.explain(&error)),
            }
        }
        Err(last)
    }

    /// What fails, in tollgate's words, if anything does: each server calls go to is tried on a
    /// connection of its own (every primary of a cluster; the Sentinels, then their primary); a
    /// cluster's map that lacks slots is said first.
    pub async fn diagnose(&self) -> Option<String> {
        match &self.0 {
            Kind::Server(node) => node.diagnose().await,
            Kind::Cluster(cluster) => {
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
            Kind::Sentinel(sentinel) => {
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
