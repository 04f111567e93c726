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
//!   promoted a replica, the next refresh finds it, within [`REFRESH_EVERY`](crate::follow::REFRESH_EVERY) of the first call
//!   after the promotion. The probe refreshes too, so an idle or breaker-skipped store follows.
//! - **The scripts are loaded ahead.** A script a call has used is loaded, in the background, on
//!   every primary the map names, and on those of every map read after (see [`Node::prepare`]):
//!   Redis does not copy functions between primaries, and a migration's target would otherwise
//!   load it within the deadline of the first call an `ASK` sends there. A primary that owns no
//!   slot (a node just added) is in no map: its first migration's first call still loads it.
//! - **An impossible reply** (a redirect to slot 20000, to port 0, for another slot than the
//!   call's; see `topology.rs`) fails its call as a backend error naming the value and the
//!   server: the map is unchanged.
//!
//! **Reading the map.** A refresh asks the nodes the current map names (its primaries first, then
//! up to 1,000 of its replicas), then the URL's seeds, and last the nodes that answered
//! `CLUSTERDOWN` within 10 s (a primary cut off from its cluster's majority answers its own
//! stale map at once), in parallel (see
//! [`ask_in_turn`]): within one query timeout, however many are dead or silent. A map that covers
//! all 16,384 slots ends the search; a map that covers fewer (a node with `cluster-enabled yes`
//! in no cluster answers none: a pod restarted without its `nodes.conf`, a node removed but still
//! in the URL) is kept only if no node answers a complete one, and never replaces a map that
//! covers more. An incomplete map is said by the probe (and so `/healthz`) and by every call
//! for a slot it lacks. Refreshes are serialized and at most one per [`REFRESH_EVERY`](crate::follow::REFRESH_EVERY), whatever
//! asks (a call that finds no owner included: an incomplete map cannot turn every call into a
//! refresh). Connections are kept per address while the map or the URL names it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};
use std::time::{Duration, Instant};

use redis::{Cmd, ErrorKind, RedisError, RedisResult, ServerErrorKind, Value};

use crate::follow::{Nodes, Refresh, ask_in_turn, in_background};
use crate::node::{self, Node, Settings};
use crate::script::Script;
use crate::target::Address;
use crate::topology::{self, MAX_PRIMARIES, Range, Redirect, SLOTS};

/// Redirects and retries one call may follow before it fails.
const MAX_ATTEMPTS: usize = 5;

/// Of those, tries after `TRYAGAIN`, `CLUSTERDOWN` or `READONLY` (the topology settling).
const MAX_SETTLES: usize = 2;

/// How long a node that answered `CLUSTERDOWN` is asked for the map after the others: a primary
/// cut off from its cluster's majority (which promotes its replica) still answers its own map,
/// where it owns its slots, and would be the first to answer every refresh.
const DOWN_ASKED_LAST: Duration = Duration::from_secs(10);

/// The most replicas a map keeps as candidates for reading it again (its primaries are asked
/// first; a map of 16,384 ranges could name 16 replicas each, and each one kept costs every
/// refresh).
const MAX_REPLICAS_KEPT: usize = MAX_PRIMARIES;

/// The most scripts [`Cluster::learn`] keeps for loading ahead (the store has three): a caller
/// with more has the rest loaded by their first call on each primary, as before.
const MAX_SCRIPTS_LEARNED: usize = 16;

/// Slot → primary.
#[derive(Clone)]
struct SlotMap {
    /// Index into `primaries` per slot; `u16::MAX`: no owner known.
    owners: Box<[u16]>,
    primaries: Vec<Arc<Node>>,
    /// The replicas the map names (candidates for reading it again), at most
    /// [`MAX_REPLICAS_KEPT`], none of them a primary.
    replicas: Vec<Address>,
    /// Slots with an owner.
    covered: usize,
    /// The node whose answer this map is (`None`: none read yet).
    source: Option<Address>,
}

impl SlotMap {
    fn empty() -> Self {
        SlotMap {
            owners: vec![u16::MAX; SLOTS].into_boxed_slice(),
            primaries: Vec::new(),
            replicas: Vec::new(),
            covered: 0,
            source: None,
        }
    }

    fn owner(&self, slot: u16) -> Option<Arc<Node>> {
        self.primaries.get(usize::from(*self.owners.get(usize::from(slot))?)).cloned()
    }

    /// Sets `slot`'s owner (a slot beyond the map is ignored: [`topology`] refuses them; so is a
    /// primary beyond [`MAX_PRIMARIES`], which only redirects can name).
    fn set(&mut self, slot: u16, node: Arc<Node>) {
        let Some(owner) = self.owners.get(usize::from(slot)).copied() else { return };
        let index = match self.primaries.iter().position(|p| p.address == node.address) {
            Some(i) => i,
            None if self.primaries.len() >= MAX_PRIMARIES => return,
            None => {
                self.primaries.push(node);
                self.primaries.len() - 1
            }
        };
        let index = u16::try_from(index).unwrap_or(u16::MAX);
        if owner == u16::MAX && index != u16::MAX {
            self.covered += 1;
        }
        self.owners[usize::from(slot)] = index;
    }
}

/// A Redis Cluster's topology and connections.
pub(crate) struct Cluster {
    seeds: Vec<Address>,
    map: RwLock<Arc<SlotMap>>,
    /// The nodes connected now: the map's and the seeds' (see `follow.rs`).
    nodes: Nodes,
    refresh: Refresh,
    /// The nodes that answered `CLUSTERDOWN` within [`DOWN_ASKED_LAST`], and when.
    down: Mutex<HashMap<Address, Instant>>,
    /// The scripts calls have used, in the order learned (each slot set once, the first empty
    /// one next): loaded on every primary a map names (see [`learn`](Self::learn)). Read by every
    /// call without a lock.
    scripts: [OnceLock<Arc<Script>>; MAX_SCRIPTS_LEARNED],
    /// Held while a script is learned (one slot set at a time).
    learning: Mutex<()>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster").field("seeds", &self.seeds).finish_non_exhaustive()
    }
}

/// A node's answer to `CLUSTER SLOTS` that did not settle the search.
struct Unsettled {
    /// Why, in tollgate's words.
    problem: String,
    /// An incomplete map it answered: its ranges, the slots they cover, and the node.
    partial: Option<(Vec<Range>, usize, Address)>,
}

impl Cluster {
    /// A cluster reached through `seeds`; returns at once (the map is read on first use).
    pub(crate) fn new(seeds: Vec<Address>, settings: Arc<Settings>) -> Self {
        Cluster {
            seeds,
            map: RwLock::new(Arc::new(SlotMap::empty())),
            nodes: Nodes::new(settings),
            refresh: Refresh::default(),
            down: Mutex::new(HashMap::new()),
            scripts: std::array::from_fn(|_| OnceLock::new()),
            learning: Mutex::new(()),
        }
    }

    /// Notes that a call uses `script`: the first time, it is loaded on every primary the map
    /// names, and from then on on those of every map read (a script no call uses, such as one
    /// for a rare reload, costs no server anything).
    fn learn(&self, script: &Script) {
        // Every call but the first of each script returns here, having taken no lock.
        let known = || self.learned().any(|s| s.function() == script.function());
        if known() {
            return;
        }
        {
            let _learning = self.learning.lock().unwrap_or_else(PoisonError::into_inner);
            let Some(slot) = self.scripts.iter().find(|slot| slot.get().is_none()) else { return };
            if known() {
                return;
            }
            let _ = slot.set(Arc::new(script.clone()));
        }
        self.prepare_primaries(&self.map());
    }

    /// The scripts learned so far, in order.
    fn learned(&self) -> impl Iterator<Item = &Arc<Script>> {
        self.scripts.iter().map_while(OnceLock::get)
    }

    /// Loads the scripts calls have used on each of `map`'s primaries that has not had them (see
    /// [`Node::prepare`]), each on a task of its own.
    fn prepare_primaries(&self, map: &SlotMap) {
        let scripts: Vec<Arc<Script>> = self.learned().cloned().collect();
        for node in &map.primaries {
            for script in scripts.iter().filter(|script| !node.is_prepared(script)) {
                let (node, script) = (node.clone(), script.clone());
                in_background(async move { node.prepare(&script).await });
            }
        }
    }

    fn map(&self) -> Arc<SlotMap> {
        self.map.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// The primary the map names for `slot`, if any.
    pub(crate) fn owner(&self, slot: u16) -> Option<Arc<Node>> {
        self.map().owner(slot)
    }

    /// The primaries the map names now.
    pub(crate) fn primaries(&self) -> Vec<Arc<Node>> {
        let map = self.map();
        let mut used: Vec<bool> = vec![false; map.primaries.len()];
        for &owner in map.owners.iter() {
            if let Some(u) = used.get_mut(usize::from(owner)) {
                *u = true;
            }
        }
        map.primaries.iter().zip(used).filter(|(_, u)| *u).map(|(p, _)| p.clone()).collect()
    }

    /// What the map lacks, if it lacks slots: how many it covers, and where it was read.
    pub(crate) fn coverage_problem(&self) -> Option<String> {
        let map = self.map();
        let source = map.source.as_ref()?;
        (map.covered < SLOTS).then(|| {
            format!(
                "the slot map covers {} of {SLOTS} slots (the map read from {source}): no node answered a complete \
                 one, and calls for the other slots fail",
                map.covered
            )
        })
    }

    /// Runs `cmd` (whose keys are all in `slot`) on the slot's primary, following redirects and
    /// topology changes (see the module docs).
    pub(crate) async fn run(
        self: &Arc<Self>,
        slot: u16,
        cmd: &Cmd,
        script: Option<&Script>,
    ) -> Result<Value, (RedisError, Option<Arc<Node>>)> {
        if let Some(script) = script {
            self.learn(script);
        }
        let mut redirect: Option<(Arc<Node>, bool)> = None;
        let mut last = None;
        let mut settles = 0;
        for _ in 0..MAX_ATTEMPTS {
            let (node, asking) = match redirect.take() {
                Some(target) => target,
                None => match self.map().owner(slot) {
                    Some(node) => (node, false),
                    None => {
                        // At most one read per REFRESH_EVERY: within it, the last read's answer.
                        self.refresh(false).await.map_err(|e| (e, None))?;
                        match self.map().owner(slot) {
                            Some(node) => (node, false),
                            None => return Err((self.no_owner(slot), None)),
                        }
                    }
                },
            };
            let error = match node.run(cmd, script, asking).await {
                Ok(value) => return Ok(value),
                Err(error) => error,
            };
            if error.kind() == ErrorKind::Server(ServerErrorKind::ClusterDown) {
                self.went_down(&node.address);
            }
            let redirected = match topology::redirect(&error) {
                Ok(Some(Redirect::Moved(to, _) | Redirect::Ask(to, _))) if to != slot => {
                    Err(format!("a redirect to another slot than the call's: {to} for a call in slot {slot} ({error})"))
                }
                Ok(redirected) => Ok(redirected),
                Err(what) => Err(what),
            };
            match redirected {
                Err(what) => {
                    tracing::warn!(server = %node.address, "an impossible reply from a Redis server: {what}");
                    return Err((topology::impossible(what), Some(node)));
                }
                Ok(Some(Redirect::Moved(moved, address))) => {
                    let target = self.nodes.get(&address).map_err(|e| (e, None))?;
                    self.set_owner(moved, target.clone());
                    self.refresh_soon();
                    redirect = Some((target, false));
                }
                Ok(Some(Redirect::Ask(_, address))) => {
                    redirect = Some((self.nodes.get(&address).map_err(|e| (e, None))?, true))
                }
                Ok(None) if (node::is_cluster_down(&error) || node::is_readonly(&error)) && settles < MAX_SETTLES => {
                    // Nothing ran: wait for the topology to settle a little, and try again (a
                    // migration's TRYAGAIN passes in milliseconds; a node that stays CLUSTERDOWN
                    // is failed after two tries, not held for the call's whole timeout).
                    settles += 1;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    let _ = self.refresh(false).await;
                }
                Ok(None) if node::is_unreachable(&error) => {
                    self.refresh_soon();
                    return Err((error, Some(node)));
                }
                Ok(None) => return Err((error, Some(node))),
            }
            last = Some((error, node));
        }
        Err(last.map_or_else(|| (self.no_owner(slot), None), |(e, n)| (e, Some(n))))
    }

    fn no_owner(&self, slot: u16) -> RedisError {
        let why = self.coverage_problem().unwrap_or_else(|| "no slot map has been read".into());
        RedisError::from((
            ErrorKind::ClusterConnectionNotFound,
            "no primary serves the slot",
            format!("slot {slot}: {why}"),
        ))
    }

    fn set_owner(&self, slot: u16, node: Arc<Node>) {
        let mut guard = self.map.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut map = SlotMap::clone(&guard);
        map.set(slot, node);
        *guard = Arc::new(map);
    }

    /// Refreshes the map in the background (unless one runs, or ran within [`REFRESH_EVERY`](crate::follow::REFRESH_EVERY)).
    pub(crate) fn refresh_soon(self: &Arc<Self>) {
        if self.refresh.due() {
            let cluster = Arc::clone(self);
            in_background(async move {
                let _ = cluster.refresh(false).await;
            });
        }
    }

    /// Reads the map again (see the module docs and [`Refresh::run`]).
    pub(crate) async fn refresh(&self, wait: bool) -> RedisResult<()> {
        self.refresh.run(wait, || self.read_map()).await
    }

    /// The nodes to ask for the map, known-good first: the current map's primaries (calls go to
    /// them), its replicas, then the seeds; last, those that answered `CLUSTERDOWN` lately.
    fn candidates(&self) -> Vec<Address> {
        let map = self.map();
        let known = map.primaries.iter().map(|p| &p.address).chain(&map.replicas);
        let mut seen = HashSet::new();
        let mut candidates: Vec<Address> =
            known.chain(&self.seeds).filter(|address| seen.insert(*address)).cloned().collect();
        let down = self.down.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        candidates.sort_by_key(|address| down.get(address).is_some_and(|at| at.elapsed() < DOWN_ASKED_LAST));
        candidates
    }

    /// Notes that the node at `address` answered `CLUSTERDOWN` (see [`DOWN_ASKED_LAST`]).
    fn went_down(&self, address: &Address) {
        let mut down = self.down.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        down.retain(|_, at| at.elapsed() < DOWN_ASKED_LAST);
        down.insert(address.clone(), Instant::now());
    }

    async fn read_map(&self) -> RedisResult<()> {
        let read = self.read_map_once().await;
        // Forget the nodes neither the map nor the URL names (any more).
        let map = self.map();
        let named: HashSet<&Address> =
            map.primaries.iter().map(|p| &p.address).chain(&map.replicas).chain(&self.seeds).collect();
        self.nodes.retain(|address| named.contains(address));
        read
    }

    async fn read_map_once(&self) -> RedisResult<()> {
        let within = self.nodes.query_timeout();
        let asked = ask_in_turn(self.candidates(), within, |address| self.ask_slots(address)).await;
        let (ranges, covered, source) = match asked {
            Ok(complete) => complete,
            Err(refused) => {
                let mut problems: Vec<String> = Vec::new();
                let mut best: Option<(Vec<Range>, usize, Address)> = None;
                for unsettled in refused.failures {
                    problems.push(unsettled.problem);
                    if let Some(partial) = unsettled.partial
                        && best.as_ref().is_none_or(|b| partial.1 > b.1)
                    {
                        best = Some(partial);
                    }
                }
                problems.extend(refused.unanswered.iter().map(|a| format!("{a}: no answer within {within:?}")));
                match best {
                    Some(best) => best,
                    None => {
                        return Err(RedisError::from((
                            ErrorKind::ClusterConnectionNotFound,
                            "no cluster node answered CLUSTER SLOTS",
                            problems.join("; "),
                        )));
                    }
                }
            }
        };
        let current = self.map();
        if covered < current.covered {
            tracing::warn!(
                node = %source,
                "a slot map covering {covered} of {SLOTS} slots was read; the one read before, from {}, covers {}: it is kept",
                current.source.as_ref().map_or_else(String::new, ToString::to_string),
                current.covered
            );
            return Ok(());
        }
        if covered < SLOTS {
            tracing::warn!(node = %source, "the best slot map read covers {covered} of {SLOTS} slots: calls for the others fail");
        }
        let mut map = SlotMap::empty();
        let primaries: HashSet<&Address> = ranges.iter().map(|r| &r.primary).collect();
        let mut seen = HashSet::new();
        map.replicas = (ranges.iter().flat_map(|r| &r.replicas))
            .filter(|r| !primaries.contains(r) && seen.insert(*r))
            .take(MAX_REPLICAS_KEPT)
            .cloned()
            .collect();
        for range in &ranges {
            let node = self.nodes.get(&range.primary)?;
            for slot in range.start..=range.end {
                map.set(slot, node.clone());
            }
        }
        map.source = Some(source);
        let map = Arc::new(map);
        *self.map.write().unwrap_or_else(std::sync::PoisonError::into_inner) = map.clone();
        self.prepare_primaries(&map);
        Ok(())
    }

    /// `CLUSTER SLOTS` at `address`: a map of all the slots settles the search.
    async fn ask_slots(&self, address: Address) -> Result<(Vec<Range>, usize, Address), Unsettled> {
        let unsettled = |problem: String| Unsettled { problem, partial: None };
        let node = self.nodes.get(&address).map_err(|e| unsettled(format!("{address}: {e}")))?;
        let mut slots = redis::cmd("CLUSTER");
        slots.arg("SLOTS");
        let reply = node.query::<Value>(&slots).await.map_err(|e| unsettled(node.explain(&e)))?;
        let ranges = topology::cluster_slots(reply, &address).map_err(|what| {
            tracing::warn!(server = %address, "an impossible CLUSTER SLOTS answer: {what}");
            unsettled(format!("{address}: an impossible CLUSTER SLOTS answer: {what}"))
        })?;
        let covered = topology::coverage(&ranges);
        if covered < SLOTS {
            let problem = format!("{address}: its slot map covers {covered} of {SLOTS} slots");
            return Err(Unsettled { problem, partial: Some((ranges, covered, address)) });
        }
        Ok((ranges, covered, address))
    }
}
