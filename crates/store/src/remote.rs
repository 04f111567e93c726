//! [`Remote`]: a store in another process (Redis), as the failure policy ([`Fallback`]) sees it.
//!
//! Besides deciding, a remote store takes *charges* (admissions made elsewhere: what a node's
//! fallback admitted while the remote could not be reached, recorded whatever the limit says), and
//! answers with each key's [`Snapshot`] and its own "now", so that a node can continue from the
//! state it last saw when the remote fails again.
//!
//! [`Fallback`]: crate::Fallback

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{Decision, Snapshot};

use crate::{Check, Store, StoreError};

/// An admission made elsewhere, to record: `check.cost` units at `age_ns` before the remote's now.
#[derive(Debug, Clone, Copy)]
pub struct Charge<'a> {
    /// Whose state, under which limit, and how much.
    pub check: Check<'a>,
    /// How long ago the admission was made (relative, so that clock skew between the node and the
    /// remote does not move it).
    pub age_ns: u64,
    /// Who made it, for exactly-once application: a node numbers its charges to a key by their
    /// running total ([`Origin::total`]); the remote keeps, per key, the highest total it applied
    /// from each node, for [`CHARGES_REMEMBERED`] after applying one, and applies of a charge only
    /// what lies above it: all of it, none for a charge sent again (riding on several calls in
    /// flight, or after a lost reply), or a part for charges the node merged after some of them
    /// were applied (counted at the remote's now: never before its own instant). A node sends a
    /// key's charges in increasing total, each call every one not yet confirmed, and sends a charge
    /// under one origin for at most [`RESEND_HORIZON`] after it first sent it. `None`: applied
    /// whenever sent.
    pub origin: Option<Origin>,
    /// What the sender's decisions relied on: the key's remaining at the remote's now, as the
    /// sender follows it (the state it last saw, this charge and its earlier ones included).
    /// After applying the charge, the remote lowers the key's remaining to at most this (a no-op
    /// unless it lost state the sender saw: the key expired early, restarted empty, a replica
    /// promoted without the last writes), by a charge at now of the difference.
    pub known_remaining: Option<u64>,
    /// The remote's snapshot (from one of its replies) that `known_remaining` follows from: a
    /// reset or refund of the key at or after its instant voids `known_remaining` (the remote
    /// changed the key after the sender's view: that is not undone). `None`: nothing seen.
    pub seen: Option<Snapshot>,
    /// `known_remaining` is a *view*, applied only if the remote's state at `seen`'s instant is
    /// behind `seen` (it lost what the sender saw: restarted empty, expired early, a replica
    /// promoted without the last writes). A node sends such a charge, of cost 0, with the first
    /// call for a key it follows and owes nothing on after a call to the remote failed; its
    /// remaining, rebuilt from a snapshot, is below the truth for the sliding log and the
    /// sub-window counter, which this keeps from lowering a key the remote holds whole.
    pub view: bool,
}

/// How long a node sends a charge again under its [`Origin`] after it first sent it, at most: 10
/// minutes. A charge no reply confirmed by then (every call that carried it failed, and one of them
/// may have run) is sent as a new charge, under another origin: the remote may have forgotten the
/// old one (see `fallback`'s ledger).
pub const RESEND_HORIZON: Duration = Duration::from_secs(600);

/// How long a remote remembers, at least, what it applied from a node (per key: the highest
/// running total), counted from each time it applies one: 11 minutes, [`RESEND_HORIZON`] and a minute
/// for the drift between the node's reading of the remote's clock and the remote's (the node dates
/// its resends by its own reading). Whatever the key's state meanwhile: a charge dated in a window
/// long over still lands in the live one (the window family counts a late charge where the state
/// is), and a bucket busy again takes it whole, so a marker living only while the key is busy
/// let a resend count twice.
pub const CHARGES_REMEMBERED: Duration = Duration::from_secs(660);

/// The largest [`Origin::total`] a charge may carry: `2^53 − 1` (the script counts in Lua's
/// doubles, exact below `2^53`).
pub const MAX_CHARGE_TOTAL: u64 = (1 << 53) - 1;

/// Who made a [`Charge`], and where it stands among the sender's charges to the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Origin {
    /// The sender's id for the key's charges, random per process (so that a restarted node starts
    /// its totals anew); a node may use another id for a key later (see `fallback`'s ledger).
    pub node: u64,
    /// The running total of the sender's charges to the key under this id, this charge's cost
    /// included: increasing, at most [`MAX_CHARGE_TOTAL`].
    pub total: u64,
}

/// Refuses charges whose total a remote cannot count exactly.
pub(crate) fn check_totals(charges: &[Charge<'_>]) -> Result<(), StoreError> {
    match charges.iter().filter_map(|c| c.origin).find(|o| o.total > MAX_CHARGE_TOTAL) {
        Some(origin) => Err(StoreError::Unsupported(format!(
            "a charge's running total of {} is above {MAX_CHARGE_TOTAL}",
            origin.total
        ))),
        None => Ok(()),
    }
}

impl<'a> Charge<'a> {
    /// `check` admitted `age_ns` ago, applied whenever sent, with nothing else known.
    #[must_use]
    pub fn new(check: Check<'a>, age_ns: u64) -> Self {
        Charge { check, age_ns, origin: None, known_remaining: None, seen: None, view: false }
    }
}

/// A call across several servers that failed part way ([`StoreError::Partial`]): one server
/// failed (its call may have run) after others answered, or while what they admitted was being
/// given back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partial {
    /// Per check of the call: what its server answered (`None`: its server failed, or was not
    /// asked). A server that answered recorded the call's charges to its checks' keys.
    pub decided: Vec<Option<Decided>>,
    /// The checks whose server failed.
    pub failed: Vec<usize>,
    /// The failure.
    pub error: StoreError,
}

impl std::fmt::Display for Partial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let answered = self.decided.iter().flatten().count();
        write!(f, "{} (after the servers of {answered} of {} checks answered)", self.error, self.decided.len())
    }
}

/// What one server answered to a check of a call that failed part way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decided {
    /// Its decision (a peek's if its server denied, or gave back what it admitted).
    pub decision: Decision,
    /// Its key after the call, at its server's instant (a refund's `at`).
    pub snapshot: Snapshot,
    /// Whether its cost stays counted there: admitted, and neither given back nor tried to be (a
    /// give-back that failed may have run: it is not tried again). The caller's to keep, or to
    /// give back with a refund.
    pub consumed: bool,
    /// Whether a live hold denied it (see [`Check::hold`]).
    pub held: bool,
}

/// What a remote answers to [`Remote::decide`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// One decision per check, as [`Store::check_all`] answers them.
    pub decisions: Vec<Decision>,
    /// Each check's key after the call, seen at `now_ns`.
    pub snapshots: Vec<Snapshot>,
    /// The remote's now, in ns since the epoch.
    pub now_ns: u64,
    /// The checks denied by a live hold (see [`Check::hold`]), by index, ascending.
    pub held: Vec<usize>,
}

impl Reply {
    /// Decisions and snapshots at `now_ns`, none of them by a hold.
    #[must_use]
    pub fn new(decisions: Vec<Decision>, snapshots: Vec<Snapshot>, now_ns: u64) -> Self {
        Reply { decisions, snapshots, now_ns, held: Vec::new() }
    }
}

/// A fault domain: the server a key's calls go to now, named by its address (`""` for a remote
/// with a single one). Names come from the remote's topology, never from a client.
pub type Domain = Arc<str>;

/// A store in another process, with what a failure policy needs besides deciding.
pub trait Remote: Store + 'static {
    /// Records `charges`, then decides `checks` all or nothing (as [`Store::check_all`]), in one
    /// atomic call; a remote of several servers that cannot (keys on several Redis Cluster
    /// servers) decides server by server and fails part way with [`StoreError::Partial`]. `checks`
    /// may be empty (a call that only records charges).
    fn decide(
        &self,
        checks: &[Check<'_>],
        charges: &[Charge<'_>],
    ) -> impl Future<Output = Result<Reply, StoreError>> + Send;

    /// One cheap round trip: whether the remote answers now.
    fn probe(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The server that decides `check` now (its fault domain: the failure policy keeps a circuit
    /// breaker per domain, so that one failing server leaves the others' keys alone). Default:
    /// one domain for the whole remote.
    fn domain(&self, check: &Check<'_>) -> Domain {
        let _ = check;
        Domain::from("")
    }

    /// Whether `domain` answers now: `Ok(true)` if it does, `Ok(false)` if the topology no longer
    /// has it (a failover replaced it: its keys are decided elsewhere now). Default: [`probe`].
    ///
    /// [`probe`]: Remote::probe
    fn probe_domain(&self, domain: &Domain) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let _ = domain;
        async { self.probe().await.map(|()| true) }
    }
}

/// A shared remote is a remote.
impl<R: Remote> Remote for std::sync::Arc<R> {
    fn decide(
        &self,
        checks: &[Check<'_>],
        charges: &[Charge<'_>],
    ) -> impl Future<Output = Result<Reply, StoreError>> + Send {
        (**self).decide(checks, charges)
    }

    fn probe(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).probe()
    }

    fn domain(&self, check: &Check<'_>) -> Domain {
        (**self).domain(check)
    }

    fn probe_domain(&self, domain: &Domain) -> impl Future<Output = Result<bool, StoreError>> + Send {
        (**self).probe_domain(domain)
    }
}
