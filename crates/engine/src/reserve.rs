//! Reservations for work whose cost is known only after it is done (LLM tokens, bytes, rows):
//! [`Engine::reserve`] charges an estimate, all or nothing, under each limit asked for (named
//! limits keyed on the caller's key, in their own scope; ad-hoc limits, sharing state with
//! `TG.CHECK` per algorithm and key) and answers an id with a deadline; [`Engine::settle_reservation`]
//! corrects it with the actual amount, exactly once, through the store (see
//! `tollgate_store::reservation`: on Redis the record lives beside the states, so any node of a
//! fleet settles what another reserved).
//!
//! A reservation is a plain all-or-nothing decision: a named limit's key held by its mitigation
//! is denied, but no action runs (no delay, shadow-ban or quarantine: the caller is the
//! application, told admitted or denied, as `TG.LIMIT` is); a rule on trial (`dry-run`) never
//! denies (see `docs/reservations.md`). Every limit of a reservation is
//! charged the same estimate and settled to the same actual. A store failure is an error (a
//! reservation cannot be admitted without a store that keeps it: `on_error` does not apply).
//!
//! [`Engine`]'s methods here: [`Engine::reserve`] and [`Engine::settle_reservation`]; the reservations this
//! engine opened are followed until settled or past their deadline ([`Opened`]) for the
//! `tollgate_reservations_open` and `_expired_total` metrics.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tollgate_core::{Decision, Limit};
use tollgate_store::{Check, Refusal, Reservation, Settled, Store, StoreError};

use crate::metrics::ReservationEvent as Event;
use crate::{Engine, EngineError, Frontend};

/// The most reservations an engine follows for its metrics (past it, new ones are not followed:
/// the gauge is then a floor).
const MAX_FOLLOWED: usize = 100_000;

/// The most limits one reservation names on a front end (`TG.RESERVE`, `POST /v1/reserve`): each is
/// a check decided, charged and kept in the reservation's record.
pub const MAX_RESERVED_LIMITS: usize = 16;

/// One limit a reservation charges.
#[derive(Debug, Clone)]
pub enum Reserving {
    /// A rule or named limit keyed on the caller's key (`key = ["key"]`), by name.
    Named(String),
    /// An ad-hoc limit (shares state per algorithm and key with `TG.CHECK` and inline HTTP limits).
    Limit(Limit),
}

/// What a reserve answered.
#[derive(Debug, Clone)]
pub struct Reserve {
    /// The tightest decision: the first denial, else the least remaining.
    pub decision: Decision,
    /// The limit of that decision.
    pub limit: Limit,
    /// Its name, for a named limit.
    pub name: Option<String>,
    /// The reservation, if every limit admitted the estimate.
    pub reservation: Option<Reservation>,
}

/// The reservations followed: by deadline, and each id's deadline.
type Followed = (BTreeSet<(u64, String)>, HashMap<String, u64>);

/// The reservations this engine opened and has not seen settled, by deadline, and how many
/// reached their deadline so: swept on each reserve, settle and scrape of the metrics (see
/// `metrics::reservations`), so that a scrape is up to date with no traffic.
#[derive(Debug, Default)]
pub(crate) struct Opened {
    inner: Mutex<Followed>,
    expired: AtomicU64,
}

impl Opened {
    fn lock(&self) -> std::sync::MutexGuard<'_, Followed> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Follows `reservation`; drops (as expired) those past `now`.
    fn open(&self, reservation: &Reservation, now: u64) {
        let mut inner = self.lock();
        if inner.1.len() < MAX_FOLLOWED {
            inner.0.insert((reservation.deadline_ns, reservation.id.clone()));
            inner.1.insert(reservation.id.clone(), reservation.deadline_ns);
        }
        self.sweep(&mut inner, now);
    }

    /// Stops following `id` (settled, or refused); drops those past `now`.
    fn close(&self, id: &str, now: u64) {
        let mut inner = self.lock();
        if let Some(deadline) = inner.1.remove(id) {
            inner.0.remove(&(deadline, id.to_string()));
        }
        self.sweep(&mut inner, now);
    }

    /// The open count and how many expired in all, once those past `now` are dropped.
    pub(crate) fn at(&self, now: u64) -> (usize, u64) {
        let mut inner = self.lock();
        self.sweep(&mut inner, now);
        (inner.1.len(), self.expired.load(Ordering::Relaxed))
    }

    fn sweep(&self, inner: &mut Followed, now: u64) {
        while let Some((deadline, id)) = inner.0.first().cloned() {
            if deadline > now {
                break;
            }
            inner.0.pop_first();
            inner.1.remove(&id);
            self.expired.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl<S: Store> Engine<S> {
    /// Reserves `estimate` for the caller's `key` under each of `limits`, all or nothing, for
    /// `ttl` (at most an hour): the reservation, if every limit admitted it, with the tightest
    /// decision. Timed as `frontend`'s decision.
    pub async fn reserve(
        &self,
        frontend: Frontend,
        limits: &[Reserving],
        key: &[u8],
        estimate: u64,
        ttl: Duration,
    ) -> Result<Reserve, EngineError> {
        if limits.is_empty() {
            return Err(EngineError::Store(StoreError::NoChecks));
        }
        let policy = self.policy.load_full();
        // Per limit: its scope, the limit reported, the limit its state is decided under (a delay
        // rule's shaper), its name, and whether its rule's hold applies.
        let mut resolved: Vec<(&str, Limit, Limit, Option<String>, bool)> = Vec::with_capacity(limits.len());
        // Per limit, whether its rule is on trial (`dry-run`): it reports, never denies.
        let mut on_trial = Vec::with_capacity(limits.len());
        let mut named_rules = Vec::new();
        for limit in limits {
            match limit {
                Reserving::Named(name) => {
                    let (index, rule) =
                        policy.rules.named(name).ok_or_else(|| EngineError::UnknownRule(name.to_string()))?;
                    if !rule.keyed_on_callers_key() {
                        return Err(EngineError::NotByName(name.to_string()));
                    }
                    named_rules.push(index);
                    let decided = crate::direct::unwaited_limit(rule);
                    let trial = matches!(rule.action, tollgate_rules::Action::DryRun);
                    on_trial.push(trial);
                    resolved.push((rule.name.as_str(), rule.limit.clone(), decided, Some(rule.name.clone()), !trial));
                }
                Reserving::Limit(limit) => {
                    on_trial.push(false);
                    resolved.push(("", limit.clone(), limit.clone(), None, false));
                }
            }
        }
        // A reservation is a key's first request after a reload as any other is: its use under
        // a rule whose algorithm changed is carried first, as for `TG.LIMIT`.
        if policy.carries.any {
            let now = self.clock.now_ns();
            for &index in &named_rules {
                Box::pin(self.carry_key(&policy, index, key, now)).await;
            }
        }
        let mut checks: Vec<Check<'_>> = resolved
            .iter()
            .zip(&on_trial)
            .map(|((scope, _, decided, _, hold), &trial)| {
                let check = Check::new(key, decided, estimate).scoped(scope);
                if trial {
                    check.reporting_at(estimate)
                } else if *hold {
                    check.with_hold()
                } else {
                    check
                }
            })
            .collect();
        let ttl_ns = crate::engine::duration_ns(ttl);
        let mut decided = self.timed(frontend, self.store.reserve_until(&checks, ttl_ns)).await;
        // A rule on trial never denies (as with `TG.LIMIT`): a reservation denied by such rules
        // alone is made again with them as peeks, charged the actual at the settle (nothing was
        // charged by the denial).
        if let Ok((reserved, None)) = &decided
            && reserved.decisions.iter().zip(&on_trial).all(|(d, &trial)| d.allowed || trial)
        {
            for (check, (d, &trial)) in checks.iter_mut().zip(reserved.decisions.iter().zip(&on_trial)) {
                if trial && !d.allowed {
                    *check = check.reporting_at(0);
                }
            }
            decided = self.timed(frontend, self.store.reserve_until(&checks, ttl_ns)).await;
        }
        let (reserved, reservation) = self.follow_reservation(decided)?;
        let tightest = reserved
            .decisions
            .iter()
            .position(|d| !d.allowed)
            .or_else(|| (0..reserved.decisions.len()).min_by_key(|&i| reserved.decisions[i].remaining))
            .unwrap_or(0);
        let (_, limit, _, name, _) = resolved.swap_remove(tightest);
        let decision = reserved.decisions.get(tightest).copied().ok_or(EngineError::Store(StoreError::NoChecks))?;
        Ok(Reserve { decision, limit, name, reservation })
    }

    /// Reserves `checks` on `store` for `ttl`, timed as `frontend`'s, counted in the metrics.
    pub(crate) async fn reserve_checks(
        &self,
        frontend: Frontend,
        store: &S,
        checks: &[Check<'_>],
        ttl: Duration,
    ) -> Result<(tollgate_store::Reserved, Option<Reservation>), EngineError> {
        let ttl_ns = crate::engine::duration_ns(ttl);
        let decided = self.timed(frontend, store.reserve_until(checks, ttl_ns)).await;
        self.follow_reservation(decided)
    }

    /// A reserve's answer, counted in the metrics (and its reservation followed).
    fn follow_reservation(
        &self,
        decided: Result<(tollgate_store::Reserved, Option<Reservation>), StoreError>,
    ) -> Result<(tollgate_store::Reserved, Option<Reservation>), EngineError> {
        let (reserved, reservation) = match decided {
            Err(refused @ StoreError::Refused(_)) => return Err(refused.into()),
            other => self.counted(other)?,
        };
        let metrics = &self.metrics.reservations;
        match &reservation {
            Some(reservation) => {
                metrics.event(Event::Opened);
                self.reservations.open(reservation, self.clock.now_ns());
            }
            None => metrics.event(Event::Denied),
        }
        Ok((reserved, reservation))
    }

    /// Settles the reservation `id` with the `actual` amount (see the module docs); refused (a
    /// [`StoreError::Refused`]) twice, after the deadline, or for an unknown id. Timed as
    /// `frontend`'s decision.
    pub async fn settle_reservation(&self, frontend: Frontend, id: &str, actual: u64) -> Result<Settled, EngineError> {
        self.settle_on(frontend, &self.store, id, actual).await
    }

    /// [`settle_reservation`](Self::settle_reservation) on `store`.
    pub(crate) async fn settle_on(
        &self,
        frontend: Frontend,
        store: &S,
        id: &str,
        actual: u64,
    ) -> Result<Settled, EngineError> {
        let settled = self.timed(frontend, store.settle(id, actual)).await;
        let metrics = &self.metrics.reservations;
        match &settled {
            Ok(s) => metrics.settled(s.estimate, s.actual),
            Err(StoreError::Refused(Refusal::AlreadySettled(_))) => metrics.event(Event::SettledAlready),
            Err(StoreError::Refused(Refusal::Expired(_))) => metrics.event(Event::Expired),
            Err(StoreError::Refused(Refusal::Unknown(_) | Refusal::Malformed(_))) => metrics.event(Event::Unknown),
            Err(_) => {}
        }
        if !matches!(&settled, Err(e) if e.is_backend()) {
            self.reservations.close(id, self.clock.now_ns());
        }
        match settled {
            // A refusal is the caller's, not the store's failing.
            Err(refused @ StoreError::Refused(_)) => Err(refused.into()),
            other => Ok(self.counted(other)?),
        }
    }
}

/// The marker descriptor of a request to Envoy's rate-limit service that reserves: its one entry
/// is `tollgate_reserve` = the reservation's life in ms (see [`Engine::reserve_descriptors`]).
pub const RESERVE_ENTRY: &str = "tollgate_reserve";

/// The descriptor of a request to Envoy's rate-limit service that settles: its one entry is
/// `tollgate_settle` = the reservation's id, its `hits_addend` the actual amount.
pub const SETTLE_ENTRY: &str = "tollgate_settle";

impl<S: Store> Engine<S> {
    /// Reserves Envoy's `descriptors` in `domain` (each at its own `hits_addend`, else
    /// `estimate`), all or nothing, for `ttl`, on Envoy's store and scope, timed as gRPC's: the
    /// verdicts (no quota; a descriptor always over its limit refuses the request without asking
    /// the store) and the reservation if admitted. A descriptor whose limit is in `shadow_mode` or
    /// `quota_mode` cannot be reserved (an error naming it): a reservation is all or nothing.
    /// Descriptors carrying different estimates are refused (an error): a settle applies one actual.
    pub async fn reserve_descriptors(
        &self,
        domain: &str,
        descriptors: &[crate::Descriptor<'_>],
        estimate: u64,
        ttl: Duration,
    ) -> Result<(crate::Verdicts, Option<Reservation>), EngineError> {
        use crate::{StatedLimit, Verdict, Verdicts};
        // A settle applies one actual to every check of a reservation: descriptors reserving
        // different estimates (100 tokens and 1 request) would each be settled to that one actual.
        let estimates: BTreeSet<u64> = descriptors.iter().map(|d| d.hits_addend.unwrap_or(estimate)).collect();
        if estimates.len() > 1 {
            return Err(EngineError::Store(StoreError::Unsupported(format!(
                "the descriptors of one reservation carry one estimate (a settle applies one actual to all), \
                 not {estimates:?}: reserve them in separate requests"
            ))));
        }
        let policy = self.policy();
        let entries: Vec<&[(&str, &str)]> = descriptors.iter().map(|d| d.entries.as_slice()).collect();
        let overrides: Vec<Option<&tollgate_envoy::RateLimit>> = descriptors.iter().map(|d| d.limit.as_ref()).collect();
        let matched = policy.envoy.limits_for_request(domain, &entries, &overrides);
        let mut verdicts = Vec::with_capacity(descriptors.len());
        let mut checks = Vec::new();
        let mut checked = Vec::new();
        let mut blocked = false;
        for (i, (descriptor, matched)) in descriptors.iter().zip(&matched).enumerate() {
            let Some(m) = matched else {
                verdicts.push(Verdict::Free);
                continue;
            };
            if m.limit.unlimited {
                verdicts.push(Verdict::Unlimited);
                continue;
            }
            if m.limit.shadow_mode || m.limit.quota_mode {
                return Err(EngineError::Store(StoreError::Unsupported(format!(
                    "descriptor {i} ({}) has a limit in shadow_mode or quota_mode, which a reservation (all or nothing) cannot take",
                    m.metric_key
                ))));
            }
            let stated = StatedLimit {
                name: m.limit.name.clone().unwrap_or_default(),
                requests_per_unit: m.limit.requests_per_unit,
                unit: m.limit.unit,
            };
            let hits = descriptor.hits_addend.unwrap_or(estimate);
            tollgate_store::reservation::check_estimate(hits).map_err(|e| {
                EngineError::Store(StoreError::Unsupported(format!("descriptor {i} ({}): {e}", m.metric_key)))
            })?;
            match &m.limit.limit {
                Some(limit) if hits <= limit.capacity() => {
                    checks.push(Check::new(&m.key, limit, hits).scoped(tollgate_rules::ENVOY_SCOPE));
                    checked.push(verdicts.len());
                    verdicts.push(Verdict::Limited { limit: stated, over: false, decision: None });
                }
                _ => {
                    blocked = true;
                    verdicts.push(Verdict::Limited { limit: stated, over: true, decision: None });
                }
            }
        }
        if blocked || checks.is_empty() {
            // Refused without asking the store, or nothing to reserve (every descriptor free).
            return Ok((Verdicts { admitted: !blocked, verdicts, quota: Vec::new() }, None));
        }
        let store = self.envoy_store.as_ref().unwrap_or(&self.store);
        let (reserved, reservation) = self.reserve_checks(Frontend::Grpc, store, &checks, ttl).await?;
        for (&at, decision) in checked.iter().zip(&reserved.decisions) {
            if let Verdict::Limited { over, decision: slot, .. } = &mut verdicts[at] {
                *over = !decision.allowed;
                *slot = Some(*decision);
            }
        }
        Ok((Verdicts { admitted: reservation.is_some(), verdicts, quota: Vec::new() }, reservation))
    }

    /// Settles, on Envoy's store, the reservation `id` with `actual` (see
    /// [`settle_reservation`](Self::settle_reservation)), timed as gRPC's.
    pub async fn settle_descriptor(&self, id: &str, actual: u64) -> Result<Settled, EngineError> {
        let store = self.envoy_store.as_ref().unwrap_or(&self.store);
        self.settle_on(Frontend::Grpc, store, id, actual).await
    }
}
