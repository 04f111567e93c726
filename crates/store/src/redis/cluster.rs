//! A Redis Cluster followed as data: the slot → primary map, read with `CLUSTER SLOTS` and kept
//! current, so that a failover or a reshard is a change to follow, not an outage to wait out.
//!
//! - **Routing.** A call goes to the primary the map names for its slot (every key of one script
//!   call shares a slot).
//! - **`MOVED`** (the slot has a new owner: a promoted replica, a finished migration) sets that
//!   slot's owner at once, sends the call there, and refreshes the whole map in the background.
//! - **`ASK`** (the slot is being migrated and the key is already at the target) sends `ASKING`
//!   and the call to the target, in one write; the map is unchanged.
//! - **`TRYAGAIN`, `CLUSTERDOWN`, `READONLY`** (a migration splitting a call's keys, a failover
//!   in progress, a demoted primary): the map is refreshed and the call tried again, within its
//!   deadline. None of these replies ran the call, so trying again never charges twice.
//! - **A primary that does not answer** (refused, timed out, connection lost) fails the call,
//!   which is never sent again (it may have run), and triggers a refresh: once Redis has
//!   promoted a replica, the next refresh finds it, within [`REFRESH_EVERY`](super::follow::REFRESH_EVERY) of the first call
//!   after the promotion. The probe refreshes too, so an idle or breaker-skipped store follows.
//!
//! A refresh asks the nodes it knows (primaries first, then the ones the URL gave) until one
//! answers; refreshes are serialized and at most one per [`REFRESH_EVERY`](super::follow::REFRESH_EVERY) unless the map lacks
//! the slot a call needs. Connections are kept per address across refreshes.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use redis::{Cmd, ErrorKind, RedisError, RedisResult, Value};

use super::follow::{Nodes, Refresh, in_background};
use super::node::{self, Node, Redirect, Settings};
use super::program::Script;
use super::target::Address;

/// Slots in a Redis Cluster.
pub(super) const SLOTS: usize = 16_384;

/// Redirects and retries one call may follow before it fails.
const MAX_ATTEMPTS: usize = 5;

/// Of those, tries after `TRYAGAIN`, `CLUSTERDOWN` or `READONLY` (the topology settling).
const MAX_SETTLES: usize = 2;

/// Slot → primary.
#[derive(Clone)]
struct SlotMap {
    /// Index into `primaries` per slot; `u16::MAX`: no owner known.
    owners: Box<[u16]>,
    primaries: Vec<Arc<Node>>,
}

impl SlotMap {
    fn empty() -> Self {
        SlotMap { owners: vec![u16::MAX; SLOTS].into_boxed_slice(), primaries: Vec::new() }
    }

    fn owner(&self, slot: u16) -> Option<Arc<Node>> {
        self.primaries.get(usize::from(self.owners[usize::from(slot)])).cloned()
    }

    fn set(&mut self, slot: u16, node: Arc<Node>) {
        let index = match self.primaries.iter().position(|p| p.address == node.address) {
            Some(i) => i,
            None => {
                self.primaries.push(node);
                self.primaries.len() - 1
            }
        };
        self.owners[usize::from(slot)] = u16::try_from(index).unwrap_or(u16::MAX);
    }
}

/// A Redis Cluster's topology and connections.
pub(super) struct Cluster {
    seeds: Vec<Address>,
    map: RwLock<Arc<SlotMap>>,
    /// Every node connected so far (kept across refreshes).
    nodes: Nodes,
    refresh: Refresh,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster").field("seeds", &self.seeds).finish_non_exhaustive()
    }
}

impl Cluster {
    /// A cluster reached through `seeds`; returns at once (the map is read on first use).
    pub(super) fn new(seeds: Vec<Address>, settings: Arc<Settings>) -> Self {
        Cluster {
            seeds,
            map: RwLock::new(Arc::new(SlotMap::empty())),
            nodes: Nodes::new(settings),
            refresh: Refresh::default(),
        }
    }

    fn map(&self) -> Arc<SlotMap> {
        self.map.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// The primary the map names for `slot`, if any.
    pub(super) fn owner(&self, slot: u16) -> Option<Arc<Node>> {
        self.map().owner(slot)
    }

    /// The primaries the map names now.
    pub(super) fn primaries(&self) -> Vec<Arc<Node>> {
        let map = self.map();
        let mut used: Vec<bool> = vec![false; map.primaries.len()];
        for &owner in map.owners.iter() {
            if let Some(u) = used.get_mut(usize::from(owner)) {
                *u = true;
            }
        }
        map.primaries.iter().zip(used).filter(|(_, u)| *u).map(|(p, _)| p.clone()).collect()
    }

    /// Runs `cmd` (whose keys are all in `slot`) on the slot's primary, following redirects and
    /// topology changes (see the module docs).
    pub(super) async fn run(
        self: &Arc<Self>,
        slot: u16,
        cmd: &Cmd,
        script: Option<&Script>,
    ) -> Result<Value, (RedisError, Option<Arc<Node>>)> {
        let mut redirect: Option<(Arc<Node>, bool)> = None;
        let mut last = None;
        let mut settles = 0;
        for _ in 0..MAX_ATTEMPTS {
            let (node, asking) = match redirect.take() {
                Some(target) => target,
                None => match self.map().owner(slot) {
                    Some(node) => (node, false),
                    None => {
                        self.refresh(true).await.map_err(|e| (e, None))?;
                        match self.map().owner(slot) {
                            Some(node) => (node, false),
                            None => return Err((no_owner(slot), None)),
                        }
                    }
                },
            };
            let error = match node.run(cmd, script, asking).await {
                Ok(value) => return Ok(value),
                Err(error) => error,
            };
            match node::redirect(&error) {
                Some(Redirect::Moved(moved, address)) => {
                    let target = self.nodes.get(&address).map_err(|e| (e, None))?;
                    self.set_owner(moved, target.clone());
                    self.refresh_soon();
                    redirect = Some((target, false));
                }
                Some(Redirect::Ask(_, address)) => {
                    redirect = Some((self.nodes.get(&address).map_err(|e| (e, None))?, true))
                }
                None if (node::is_cluster_down(&error) || node::is_readonly(&error)) && settles < MAX_SETTLES => {
                    // Nothing ran: wait for the topology to settle a little, and try again (a
                    // migration's TRYAGAIN passes in milliseconds; a node that stays CLUSTERDOWN
                    // is failed after two tries, not held for the call's whole timeout).
                    settles += 1;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    let _ = self.refresh(false).await;
                }
                None if node::is_unreachable(&error) => {
                    self.refresh_soon();
                    return Err((error, Some(node)));
                }
                None => return Err((error, Some(node))),
            }
            last = Some((error, node));
        }
        Err(last.map_or_else(|| (no_owner(slot), None), |(e, n)| (e, Some(n))))
    }

    fn set_owner(&self, slot: u16, node: Arc<Node>) {
        let mut guard = self.map.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut map = SlotMap::clone(&guard);
        map.set(slot, node);
        *guard = Arc::new(map);
    }

    /// Refreshes the map in the background (unless one runs, or ran within [`REFRESH_EVERY`](super::follow::REFRESH_EVERY)).
    pub(super) fn refresh_soon(self: &Arc<Self>) {
        if self.refresh.due() {
            let cluster = Arc::clone(self);
            in_background(async move {
                let _ = cluster.refresh(false).await;
            });
        }
    }

    /// Reads the map from the first node that answers `CLUSTER SLOTS` (see [`Refresh::run`];
    /// `needed`: a call found no owner).
    pub(super) async fn refresh(&self, needed: bool) -> RedisResult<()> {
        self.refresh.run(needed, || self.read_map()).await
    }

    async fn read_map(&self) -> RedisResult<()> {
        let mut candidates: Vec<Address> = self.map().primaries.iter().map(|p| p.address.clone()).collect();
        for seed in &self.seeds {
            if !candidates.contains(seed) {
                candidates.push(seed.clone());
            }
        }
        for address in self.nodes.addresses() {
            if !candidates.contains(&address) {
                candidates.push(address);
            }
        }
        let mut last = None;
        for address in candidates {
            let node = self.nodes.get(&address)?;
            let mut slots = redis::cmd("CLUSTER");
            slots.arg("SLOTS");
            let reply = tokio::time::timeout(self.nodes.query_timeout(), node.query::<Value>(&slots));
            let ranges = match reply.await {
                Ok(Ok(value)) => parse_slots(value, &address.host),
                Ok(Err(error)) => Err(error),
                Err(_) => Err(RedisError::from((ErrorKind::Io, "no answer to CLUSTER SLOTS"))),
            };
            match ranges {
                Ok(ranges) => {
                    let mut map = SlotMap::empty();
                    for (start, end, owner) in ranges {
                        let node = self.nodes.get(&owner)?;
                        for slot in start..=end {
                            map.set(slot, node.clone());
                        }
                    }
                    *self.map.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(map);
                    return Ok(());
                }
                Err(error) => last = Some(node.explain(&error)),
            }
        }
        Err(RedisError::from((
            ErrorKind::ClusterConnectionNotFound,
            "no cluster node answered CLUSTER SLOTS",
            last.unwrap_or_default(),
        )))
    }
}

fn no_owner(slot: u16) -> RedisError {
    RedisError::from((ErrorKind::ClusterConnectionNotFound, "no primary serves the slot", slot.to_string()))
}

/// `CLUSTER SLOTS`' reply as (first slot, last slot, primary); an empty host is the node asked.
fn parse_slots(value: Value, asked: &str) -> RedisResult<Vec<(u16, u16, Address)>> {
    let bad =
        |what: &'static str| RedisError::from((ErrorKind::Parse, "unexpected CLUSTER SLOTS reply", what.to_string()));
    let Value::Array(ranges) = value else { return Err(bad("not an array")) };
    let mut out = Vec::with_capacity(ranges.len());
    for range in ranges {
        let Value::Array(fields) = range else { return Err(bad("a range is not an array")) };
        let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(primary))) =
            (fields.first(), fields.get(1), fields.get(2))
        else {
            return Err(bad("a range lacks its slots or its primary"));
        };
        let host = match primary.first() {
            Some(Value::BulkString(host)) => String::from_utf8_lossy(host).into_owned(),
            Some(Value::SimpleString(host)) => host.clone(),
            _ => return Err(bad("a primary without a host")),
        };
        let Some(Value::Int(port)) = primary.get(1) else { return Err(bad("a primary without a port")) };
        let host = if host.is_empty() || host == "?" { asked.to_string() } else { host };
        let (Ok(start), Ok(end), Ok(port)) = (u16::try_from(*start), u16::try_from(*end), u16::try_from(*port)) else {
            return Err(bad("a slot or port out of range"));
        };
        if usize::from(end) >= SLOTS || start > end {
            return Err(bad("a slot out of range"));
        }
        out.push((start, end, Address { host, port }));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn int(v: i64) -> Value {
        Value::Int(v)
    }

    fn node(host: &str, port: i64) -> Value {
        Value::Array(vec![Value::BulkString(host.as_bytes().to_vec()), int(port), Value::BulkString(b"id".to_vec())])
    }

    #[test]
    fn reads_cluster_slots() {
        let reply = Value::Array(vec![
            Value::Array(vec![int(0), int(5460), node("10.0.0.1", 7000), node("10.0.0.4", 7003)]),
            Value::Array(vec![int(5461), int(16383), node("", 7001)]),
        ]);
        let ranges = parse_slots(reply, "10.0.0.9").unwrap();
        assert_eq!(ranges[0], (0, 5460, Address { host: "10.0.0.1".into(), port: 7000 }));
        assert_eq!(
            ranges[1],
            (5461, 16383, Address { host: "10.0.0.9".into(), port: 7001 }),
            "an empty host is the node asked"
        );
        for bad in [
            Value::Int(1),
            Value::Array(vec![Value::Array(vec![int(0), int(16384), node("h", 1)])]),
            Value::Array(vec![Value::Array(vec![int(5), int(1), node("h", 1)])]),
            Value::Array(vec![Value::Array(vec![int(0), int(1), node("h", 70000)])]),
            Value::Array(vec![Value::Array(vec![int(0), int(1)])]),
        ] {
            assert!(parse_slots(bad, "h").is_err());
        }
    }
}
