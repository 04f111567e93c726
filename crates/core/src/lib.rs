//! # tollgate-core
//!
//! The exact rate-limit algorithms of tollgate, as pure steps over small state values: no I/O,
//! no locks, and no clock reads (the [`Clock`]s here are for the stores that call the steps). A store (in-memory, Redis) keeps the state per key and supplies `now`.
//!
//! Every convention is the one in `docs/SEMANTICS.md`: `burst` is the number of requests admitted at
//! once from idle, the emission interval `T = ceil(period / count)` rounds up so that no more
//! than `count` are admitted per `period`, rejected requests consume nothing, `cost = 0` is a
//! peek, and all arithmetic is checked integer arithmetic in nanoseconds.
//!
//! ```
//! use tollgate_core::{Limit, algorithm::{Gcra, RateState}};
//!
//! let limit = Limit::per_second(10).burst(10).build()?;
//! let mut state = Gcra::default();
//! let now = 1_700_000_000_000_000_000; // ns since the Unix epoch
//! let admitted = (0..15).filter(|_| state.check(now, &limit, 1).unwrap().allowed).count();
//! assert_eq!(admitted, 10);
//! let next = state.check(now, &limit, 1)?;
//! assert_eq!(next.retry_after().as_millis(), 100);
//! # Ok::<(), tollgate_core::Error>(())
//! ```

pub mod algorithm;
mod calendar;
mod clock;
mod decision;
mod error;
mod limit;
mod spec;
#[cfg(feature = "trace")]
pub mod trace;
mod words;

pub use algorithm::{MAX_AHEAD_NS, MAX_COUNTER, RateState, Snapshot, State};
pub use calendar::{Calendar, CalendarUnit, DEFAULT_TIME_ZONE};
pub use clock::{Clock, ManualClock, SystemClock};
pub use decision::Decision;
pub use error::Error;
pub use limit::{
    Algorithm, DEFAULT_SLICES, Limit, LimitBuilder, MAX_LOG_COUNT, MAX_PERIOD_NS, MAX_SLICES, format_period,
    parse_period_ns,
};
pub use spec::LimitSpec;
pub use words::UnknownWord;
