//! # tollgate-engine
//!
//! One policy engine behind every front end: the RESP, HTTP and Envoy gRPC APIs of `tollgate
//! serve`, the tower/axum middleware and `tollgate proxy`. Front ends parse a request into its
//! characteristics ([`Request`], or Envoy's [`Descriptor`]s) and render what the engine decides;
//! the engine does the rest:
//!
//! 1. **the measured rates** of the rules that ask for them ([`rates`]: an EWMA per key on the
//!    real elapsed time, bounded, a top-k; [`Engine::top`]);
//! 2. **mitigations in force**: a key a rule holds (for its `timeout`, or while over for a
//!    `mitigation.match` wider than its `match`) is answered by the rule's action at once. An
//!    enforced rule's holds live in the store, beside its counts ([`Store::hold`]), so that every
//!    engine sharing the store holds the key as one; this engine's own table (`blocks`: bounded,
//!    sharded, skipped until a first hold) answers the holds it knows without asking the store
//!    (see `shared`);
//! 3. **the plan**: the rules that count the request, each with its key and cost (or a 400 for a
//!    bad cost header, or a missing key part under `on_missing = "reject"`), and the keys over
//!    their `when_rate_above`;
//! 4. **admission, all or nothing**: one [`Store::reserve`] for every enforced rule, each in its
//!    own scope (the rule's name); `count_status` rules are *reserved* like the others, so
//!    concurrent requests can never push more than `count` through, and refunded by
//!    [`Engine::complete`] when the response's status is not one they count, or by an
//!    [`Unsettled`] dropped before it is known (`settle`); a refusal owed only to reservations
//!    in flight is not "over" and holds nothing;
//! 5. **the action** of the first rule over its limit: 429, shadow-ban, delay (a GCRA shaper
//!    widened by what the request may wait: `max_delay`, its time, a place among those waiting,
//!    see `waiting`); a `route` rule yields to one that rejects, and its quarantined request is
//!    still charged to the others (`enforce`); dry-run rules are checked on their own and never
//!    block;
//! 6. **metrics** ([`metrics`]), and a store error answered by `on_error`, never silently. Every
//!    decision is timed here, by the injected clock, whichever front end asked ([`latency`]).
//!
//! The policy has two sources: the rules, and Envoy's configuration (envoyproxy/ratelimit's YAML,
//! [`EngineBuilder::envoy`]), whose descriptors the engine decides for Envoy's rate-limit service
//! ([`Engine::admit_descriptors`]: free, unlimited, always over, enforced or shadow; all or
//! nothing; envoyproxy/ratelimit's per-limit counters). Both are one [`Policy`], swapped
//! atomically by [`Engine::reload`] or [`Engine::reload_envoy`] ([`reload`] watches their files);
//! the state of a rule lives in the store under its name, so a rule that keeps its name keeps its
//! counts across a reload, carried into its new algorithm's state if that changed (`carry`). Time
//! comes from an injected [`Clock`].
//!
//! **Where [`Engine`]'s methods are**: one file per topic, each saying which it holds. `builder`
//! (building an engine), `engine` (the engine and its accessors), `admit` (deciding a request),
//! `enforce` (several rules, all or nothing), `mitigation` (keys over: holds, actions,
//! `on_error`), `shared` (holds in the store), `measure` (measured rates, [`Engine::top`]),
//! `settle` (`count_status` reservations), `reserve` (reserve → settle for front ends), `carry` (counts carried across a reload),
//! `descriptors` (Envoy's descriptors; their store half in `asks`), `direct` (named and ad-hoc
//! limits, resets) and [`reload`] (swapping the policy); the policy in force compiled, in
//! `policy`.
//!
//! [`Clock`]: tollgate_core::Clock
//! [`Store::hold`]: tollgate_store::Store::hold
//! [`Store::reserve`]: tollgate_store::Store::reserve

mod admission;
mod admit;
mod asks;
mod blocks;
mod builder;
mod carry;
mod descriptors;
mod direct;
mod enforce;
mod engine;
pub mod latency;
mod line_table;
mod measure;
pub mod metrics;
mod mitigation;
mod policy;
pub mod rates;
pub mod reload;
mod reserve;
mod settle;
mod sharded;
mod shared;
mod waiting;

pub use admission::{Admission, Answer, Fields, Pending, Proceed};
pub use blocks::DEFAULT_MAX_BLOCKS;
pub use builder::EngineBuilder;
pub use descriptors::{Descriptor, StatedLimit, Verdict, Verdicts};
pub use direct::EngineError;
pub use engine::Engine;
pub use metrics::{Frontend, Metrics, Outcome, Source};
pub use policy::{Current, Policy};
pub use rates::{DEFAULT_MAX_RATED_KEYS, MAX_TOP, Talker};
pub use reserve::{MAX_RESERVED_LIMITS, RESERVE_ENTRY, Reserve, Reserving, SETTLE_ENTRY};
pub use settle::{Actual, Unsettled};
pub use tollgate_rules::Request;
pub use waiting::DEFAULT_MAX_DELAYED;
