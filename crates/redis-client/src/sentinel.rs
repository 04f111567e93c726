//! A primary found through Redis Sentinel, and followed when the Sentinels switch it.
//!
//! - **Discovery.** The Sentinels are asked `SENTINEL GET-MASTER-ADDR-BY-NAME name` in turn, in
//!   parallel (see `follow.rs`: the next one as soon as one fails or after 20 ms without an
//!   answer, all within one query timeout); the address the first one gives is used once that
//!   server says it is a primary (`ROLE`). `ROLE` is asked every time, of the primary in use too:
//!   a primary demoted and back as a replica (which may accept writes, with `replica-read-only
//!   no`, and lose them) gets no more calls, even while a Sentinel that has not seen the switch
//!   still names it.
//! - **Re-read while calls succeed.** A call made [`REREAD_EVERY`] or more after the last
//!   discovery ended starts another in the background: a primary cut off from the Sentinels
//!   (which promote a replica) but not from this node stops getting this node's calls within
//!   [`REREAD_EVERY`] and two query timeouts of the Sentinels' switch (a discovery under way at
//!   the switch may have heard the old answer), as long as calls keep coming (docs/failure.md
//!   states the bound).
//! - **Following a switch.** A `READONLY` reply (the primary was demoted: the call did not run) asks
//!   the Sentinels again (as soon as the last discovery is [`REFRESH_EVERY`](crate::follow::REFRESH_EVERY) old) and retries the
//!   call on the new primary, within its deadline. A primary that does not answer fails the call
//!   (it may have run; it is never sent twice) and asks the Sentinels again in the background, at
//!   most once per [`REFRESH_EVERY`](crate::follow::REFRESH_EVERY): once they have promoted a replica, calls move to it within
//!   that time. The probe asks too, so an idle store follows.
//!
//! The data servers named are kept connected while they are the primary; the others are
//! forgotten.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use redis::{Cmd, ErrorKind, RedisError, RedisResult, Value};

use crate::follow::{Nodes, Refresh, ask_in_turn, in_background};
use crate::node::{self, Node, Settings};
use crate::script::Script;
use crate::target::Address;
use crate::topology;

/// Tries of one call across switches before it fails.
const MAX_ATTEMPTS: usize = 3;

/// How old the last discovery may be before a call starts another (in the background).
pub(crate) const REREAD_EVERY: Duration = Duration::from_secs(1);

/// The Sentinels, and the primary they name.
pub(crate) struct Sentinel {
    sentinels: Vec<Arc<Node>>,
    master_name: String,
    primary: RwLock<Option<Arc<Node>>>,
    /// The data servers connected now (the primary; see `follow.rs`).
    nodes: Nodes,
    refresh: Refresh,
}

impl std::fmt::Debug for Sentinel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sentinel").field("master_name", &self.master_name).finish_non_exhaustive()
    }
}

/// Why one Sentinel's answer was not used.
struct Unused {
    problem: String,
    /// The server it named, which says it is not a primary.
    not_primary: Option<Address>,
}

impl From<String> for Unused {
    fn from(problem: String) -> Self {
        Unused { problem, not_primary: None }
    }
}

impl Sentinel {
    /// The primary named `master_name` by `sentinels`; returns at once (asked on first use).
    pub(crate) fn new(
        sentinels: Vec<Address>,
        master_name: String,
        settings: Arc<Settings>,
        sentinel_settings: Arc<Settings>,
    ) -> RedisResult<Self> {
        let sentinels =
            sentinels.into_iter().map(|a| Node::open(a, sentinel_settings.clone())).collect::<RedisResult<_>>()?;
        Ok(Sentinel {
            sentinels,
            master_name,
            primary: RwLock::new(None),
            nodes: Nodes::new(settings),
            refresh: Refresh::default(),
        })
    }

    /// The primary as last discovered.
    pub(crate) fn primary(&self) -> Option<Arc<Node>> {
        self.primary.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    fn set_primary(&self, node: Option<Arc<Node>>) {
        *self.primary.write().unwrap_or_else(std::sync::PoisonError::into_inner) = node;
    }

    /// Runs `cmd` on the primary, following a switch (see the module docs).
    pub(crate) async fn run(
        self: &Arc<Self>,
        cmd: &Cmd,
        script: Option<&Script>,
    ) -> Result<Value, (RedisError, Option<Arc<Node>>)> {
        if self.refresh.age().is_some_and(|age| age >= REREAD_EVERY) {
            self.refresh_soon();
        }
        let mut last = None;
        for _ in 0..MAX_ATTEMPTS {
            let node = match self.primary() {
                Some(node) => node,
                None => {
                    // At most one discovery per REFRESH_EVERY: within it, the last one's answer.
                    self.refresh(false).await.map_err(|e| (e, None))?;
                    self.primary().ok_or_else(|| (self.unknown(), None))?
                }
            };
            match node.run(cmd, script, false).await {
                Ok(value) => return Ok(value),
                Err(error) if node::is_readonly(&error) => {
                    let _ = self.refresh(true).await;
                    last = Some((error, Some(node)));
                }
                Err(error) => {
                    if node::is_unreachable(&error) {
                        self.refresh_soon();
                    }
                    return Err((error, Some(node)));
                }
            }
        }
        Err(last.unwrap_or_else(|| (self.unknown(), None)))
    }

    fn unknown(&self) -> RedisError {
        RedisError::from((
            ErrorKind::MasterNameNotFoundBySentinel,
            "no Sentinel names a primary",
            self.master_name.clone(),
        ))
    }

    /// Asks the Sentinels again in the background (unless that runs, or ran within
    /// [`REFRESH_EVERY`](crate::follow::REFRESH_EVERY)).
    pub(crate) fn refresh_soon(self: &Arc<Self>) {
        if self.refresh.due() {
            let sentinel = Arc::clone(self);
            in_background(async move {
                let _ = sentinel.refresh(false).await;
            });
        }
    }

    /// Asks the Sentinels which server is the primary, and switches to it (see [`Refresh::run`]).
    pub(crate) async fn refresh(&self, wait: bool) -> RedisResult<()> {
        self.refresh.run(wait, || self.discover()).await
    }

    async fn discover(&self) -> RedisResult<()> {
        let within = self.nodes.query_timeout();
        let asked = ask_in_turn(self.sentinels.iter().cloned(), within, |sentinel| self.ask(sentinel)).await;
        let current = self.primary();
        match asked {
            Ok(node) => {
                if current.as_ref().is_none_or(|c| c.address != node.address) {
                    tracing::info!(master = %self.master_name, primary = %node.address, "Sentinel: calls go to this primary");
                }
                let address = node.address.clone();
                self.set_primary(Some(node));
                self.nodes.retain(|a| *a == address);
                Ok(())
            }
            Err(refused) => {
                if let Some(current) = current
                    && refused.failures.iter().any(|u| u.not_primary.as_ref() == Some(&current.address))
                {
                    tracing::warn!(
                        master = %self.master_name,
                        server = %current.address,
                        "Sentinel: the primary in use says it is not a primary any more: no calls go to it"
                    );
                    self.set_primary(None);
                }
                // Keep no connection to the servers named meanwhile (a Sentinel may name a new one
                // every time).
                let kept = self.primary().map(|p| p.address.clone());
                self.nodes.retain(|a| Some(a) == kept.as_ref());
                let mut problems: Vec<String> = refused.failures.into_iter().map(|u| u.problem).collect();
                problems
                    .extend(refused.unanswered.iter().map(|s| format!("{}: no answer within {within:?}", s.address)));
                Err(RedisError::from((
                    ErrorKind::MasterNameNotFoundBySentinel,
                    "no primary found through the Sentinels",
                    problems.join("; "),
                )))
            }
        }
    }

    /// One Sentinel's primary, once that server says it is one.
    async fn ask(&self, sentinel: Arc<Node>) -> Result<Arc<Node>, Unused> {
        let mut ask = redis::cmd("SENTINEL");
        ask.arg("GET-MASTER-ADDR-BY-NAME").arg(&self.master_name);
        let reply = sentinel.query::<Value>(&ask).await.map_err(|e| sentinel.explain(&e))?;
        let address = match topology::sentinel_primary(reply) {
            Ok(Some(address)) => address,
            Ok(None) => {
                return Err(format!("{}: knows no master named {:?}", sentinel.address, self.master_name).into());
            }
            Err(what) => {
                tracing::warn!(server = %sentinel.address, "an impossible Sentinel answer: {what}");
                return Err(format!("{}: an impossible answer: {what}", sentinel.address).into());
            }
        };
        let node = self.nodes.get(&address).map_err(|e| format!("{address}: {e}"))?;
        let role = node.query::<Value>(&redis::cmd("ROLE")).await.map_err(|e| node.explain(&e))?;
        match topology::is_primary(&role) {
            Ok(true) => Ok(node),
            Ok(false) => Err(Unused {
                problem: format!(
                    "{address}: named by {} but not a primary (ROLE says {})",
                    sentinel.address,
                    topology::role_name(&role)
                ),
                not_primary: Some(address),
            }),
            Err(what) => Err(format!("{address}: named by {} but {what}", sentinel.address).into()),
        }
    }
}
