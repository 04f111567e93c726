//! A primary found through Redis Sentinel, and followed when the Sentinels switch it.
//!
//! - **Discovery.** The Sentinels are asked in turn `SENTINEL GET-MASTER-ADDR-BY-NAME name`; the
//!   address the first one gives is used once that server says it is a primary (`ROLE`), so a
//!   Sentinel that has not yet seen a switch cannot send calls to a replica for long.
//! - **Following a switch.** A `READONLY` reply (the primary was demoted: the call did not run) asks
//!   the Sentinels again at once and retries the call on the new primary, within its deadline. A
//!   primary that does not answer fails the call (it may have run; it is never sent twice) and
//!   asks the Sentinels again in the background, at most once per [`REFRESH_EVERY`](super::follow::REFRESH_EVERY): once they
//!   have promoted a replica, calls move to it within that time. The probe asks too, so an idle
//!   store follows.

use std::sync::{Arc, RwLock};

use redis::{Cmd, ErrorKind, RedisError, RedisResult, Value};

use super::follow::{Nodes, Refresh, in_background};
use super::node::{self, Node, Settings};
use super::program::Script;
use super::target::Address;

/// Tries of one call across switches before it fails.
const MAX_ATTEMPTS: usize = 3;

/// The Sentinels, and the primary they name.
pub(super) struct Sentinel {
    sentinels: Vec<Arc<Node>>,
    master_name: String,
    primary: RwLock<Option<Arc<Node>>>,
    /// Every data server connected so far (a primary switched back is reused).
    nodes: Nodes,
    refresh: Refresh,
}

impl std::fmt::Debug for Sentinel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sentinel").field("master_name", &self.master_name).finish_non_exhaustive()
    }
}

impl Sentinel {
    /// The primary named `master_name` by `sentinels`; returns at once (asked on first use).
    pub(super) fn new(
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
    pub(super) fn primary(&self) -> Option<Arc<Node>> {
        self.primary.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Runs `cmd` on the primary, following a switch (see the module docs).
    pub(super) async fn run(
        self: &Arc<Self>,
        cmd: &Cmd,
        script: Option<&Script>,
    ) -> Result<Value, (RedisError, Option<Arc<Node>>)> {
        let mut last = None;
        for _ in 0..MAX_ATTEMPTS {
            let node = match self.primary() {
                Some(node) => node,
                None => {
                    self.refresh(true).await.map_err(|e| (e, None))?;
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
    /// [`REFRESH_EVERY`](super::follow::REFRESH_EVERY)).
    pub(super) fn refresh_soon(self: &Arc<Self>) {
        if self.refresh.due() {
            let sentinel = Arc::clone(self);
            in_background(async move {
                let _ = sentinel.refresh(false).await;
            });
        }
    }

    /// Asks the Sentinels which server is the primary, and switches to it (see [`Refresh::run`]).
    pub(super) async fn refresh(&self, needed: bool) -> RedisResult<()> {
        self.refresh.run(needed, || self.discover()).await
    }

    async fn discover(&self) -> RedisResult<()> {
        let wait = self.nodes.query_timeout();
        let mut problems = Vec::new();
        for sentinel in &self.sentinels {
            let mut ask = redis::cmd("SENTINEL");
            ask.arg("GET-MASTER-ADDR-BY-NAME").arg(&self.master_name);
            let address = match tokio::time::timeout(wait, sentinel.query::<Option<(String, u16)>>(&ask)).await {
                Ok(Ok(Some((host, port)))) => Address { host, port },
                Ok(Ok(None)) => {
                    problems.push(format!("{}: knows no master named {:?}", sentinel.address, self.master_name));
                    continue;
                }
                Ok(Err(error)) => {
                    problems.push(sentinel.explain(&error));
                    continue;
                }
                Err(_) => {
                    problems.push(format!("{}: no answer within {wait:?}", sentinel.address));
                    continue;
                }
            };
            if self.primary().is_some_and(|p| p.address == address) {
                return Ok(());
            }
            let node = self.nodes.get(&address)?;
            match tokio::time::timeout(wait, node.query::<Value>(&redis::cmd("ROLE"))).await {
                Ok(Ok(Value::Array(role))) if matches!(role.first(), Some(Value::BulkString(r)) if r == b"master") => {
                    tracing::info!(master = %self.master_name, primary = %address, "Sentinel: calls go to this primary");
                    *self.primary.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(node);
                    return Ok(());
                }
                Ok(Ok(_)) => problems.push(format!("{address}: named by {} but not a primary yet", sentinel.address)),
                Ok(Err(error)) => problems.push(node.explain(&error)),
                Err(_) => problems.push(format!("{address}: no answer within {wait:?}")),
            }
        }
        Err(RedisError::from((
            ErrorKind::MasterNameNotFoundBySentinel,
            "no primary found through the Sentinels",
            problems.join("; "),
        )))
    }
}
