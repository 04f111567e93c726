//! The layout of a decision call's arguments and reply, and the bounds of the values it carries:
//! written once here, next to the script (`lua/`), which reads them as Lua locals generated from
//! these constants ([`lua_constants`]), and read by the native module (`tollgate-redis-module`,
//! which depends on this crate for them): every offset and bound named once, with a version both
//! check.
//!
//! Built without the `redis` feature too, so that the module gets the layout without the Redis
//! client.

macro_rules! version {
    () => {
        "5"
    };
}

/// The layout's version, sent first in every call and checked by the script: a call and a
/// script that disagree fail (`TOLLGATE_VERSION`) rather than misread each other.
pub const VERSION: &str = version!();

/// Defines each offset as a Rust constant and, in the same order, as a Lua local
/// ([`LAYOUT_LUA`]), so that no offset is written twice.
macro_rules! layout {
    ($($(#[doc = $doc:literal])* $name:ident = $value:literal;)*) => {
        // Constants of one group share its first one's doc.
        $( $(#[doc = $doc])* #[allow(missing_docs)] pub const $name: usize = $value; )*
        /// The layout as Lua locals, the version included.
        pub const LAYOUT_LUA: &str =
            concat!($("local ", stringify!($name), " = ", stringify!($value), "\n",)* "local VERSION = '", version!(), "'\n");
    };
}

layout! {
    /// ARGV's header (1-based, as Lua reads ARGV): the layout's version ...
    ARG_VERSION = 1;
    /// ... now's seconds and nanoseconds ('' for the server's TIME) ...
    ARG_NOW_SEC = 2;
    ARG_NOW_NSEC = 3;
    /// ... the TTL margin in ms, and how many checks, charges and refunds follow.
    ARG_MARGIN = 4;
    ARG_CHECKS = 5;
    ARG_CHARGES = 6;
    ARG_REFUNDS = 7;
    HEADER_ARGS = 7;
    /// A limit and a cost, from the start of a check, a charge or a refund.
    LIMIT_ALGORITHM = 1;
    LIMIT_COUNT = 2;
    LIMIT_PERIOD = 3;
    LIMIT_BURST = 4;
    LIMIT_SLICES = 5;
    LIMIT_EMISSION = 6;
    LIMIT_TOLERANCE = 7;
    LIMIT_COST = 8;
    /// A check is its limit and cost, then whether its scope's hold on its key applies (1: the key
    /// of that hold follows the call's markers in KEYS; 0: none).
    CHECK_HOLD = 9;
    CHECK_ARGS = 9;
    /// A charge: its limit and cost, then its age, origin (node, running total), what the sender knew
    /// (remaining, the snapshot it follows from: instant, used, previous) and whether that is a view.
    CHARGE_AGE = 9;
    CHARGE_NODE = 10;
    CHARGE_TOTAL = 11;
    CHARGE_KNOWN = 12;
    CHARGE_SEEN_AT = 13;
    CHARGE_SEEN_USED = 14;
    CHARGE_SEEN_PREVIOUS = 15;
    CHARGE_VIEW = 16;
    CHARGE_ARGS = 16;
    /// A refund: its limit and cost, then the admission's instant and reset_after_ns.
    REFUND_AT = 9;
    REFUND_RESET = 10;
    REFUND_ARGS = 10;
    /// A lease, after everything else: the lessee and the lifetime in ms.
    LEASE_LESSEE = 1;
    LEASE_LIFETIME = 2;
    LEASE_ARGS = 2;
    /// Integers per check in the reply (allowed: 1, 0, or 2 when denied by a live hold; limit,
    /// remaining, retry, reset, used, previous); the server's now (seconds, nanoseconds) follows
    /// them, then a lease's two.
    REPLY_CHECK = 7;
    REPLY_NOW = 2;
    /// A lease's two (units granted, lessees) end the reply.
    LEASE_REPLY = 2;
    /// The hold script's value after the header: the hold's length in ns.
    HOLD_NS = 1;
}

/// Seconds from now beyond which a stored instant counts as "long ago" or "far ahead" (104 days):
/// the script computes in ns relative to now, exact in a double below 2^53 ns, and clamps instants
/// further away (the module clamps them the same way, so both read any stored value alike). Every
/// state is idle long before (periods and `burst × T` are at most 50 days, a charge's schedule at
/// most [`MAX_AHEAD_NS`] ahead), so the clamp changes no decision on state tollgate wrote.
pub const FAR_SEC: u64 = 9_000_000;

use tollgate_core::Algorithm;
pub use tollgate_core::{MAX_AHEAD_NS, MAX_COUNTER};

/// The native module's command: one lone check, with the script's arguments after its key.
pub const MODULE_COMMAND: &str = "TOLLGATE.CHECK";

/// The algorithms the native module decides (by tollgate-core's steps, on the values the script
/// stores): all but the sliding log, a Redis list the script reads entry by entry (a binary
/// search), which the core's step, on a whole log in memory, would have to read whole.
pub const MODULE_ALGORITHMS: [Algorithm; 6] = [
    Algorithm::Gcra,
    Algorithm::TokenBucket,
    Algorithm::LeakyBucket,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindow,
    Algorithm::SubWindow,
];

/// Whether the native module decides checks of `algorithm` (the store sends it only those; it
/// refuses any other with `TOLLGATE_UNSUPPORTED`).
#[must_use]
pub fn module_decides(algorithm: Algorithm) -> bool {
    MODULE_ALGORITHMS.contains(&algorithm)
}

// A double holds every bound exactly, and FAR a sliding window's two periods back and a charged
// schedule's end: checked when the crate builds.
const _: () = assert!(MAX_AHEAD_NS < 1 << 53 && MAX_COUNTER < 1 << 53);
const _: () = assert!(FAR_SEC * 1_000_000_000 > 2 * tollgate_core::MAX_PERIOD_NS);
const _: () = assert!(FAR_SEC * 1_000_000_000 > MAX_AHEAD_NS);

/// The layout and the bounds the script shares with tollgate-core ([`MAX_AHEAD_NS`],
/// [`MAX_COUNTER`], [`FAR_SEC`]) as Lua locals: the head of every script, generated so that no
/// bound is copied as a literal into the Lua.
#[must_use]
pub fn lua_constants() -> String {
    format!(
        "{LAYOUT_LUA}local MAX_AHEAD = {MAX_AHEAD_NS}\nlocal MAX_COUNTER = {MAX_COUNTER}\nlocal FAR_SEC = {FAR_SEC}\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bounds_reach_the_lua_exactly() {
        let lua = lua_constants();
        assert!(lua.starts_with("local ARG_VERSION = 1\nlocal ARG_NOW_SEC = 2\n"), "{lua}");
        assert!(lua.contains("\nlocal MAX_AHEAD = 4492800000000000\n"), "{lua}");
        assert!(lua.contains("\nlocal MAX_COUNTER = 4503599627370496\n"), "{lua}");
        assert!(lua.ends_with("\nlocal FAR_SEC = 9000000\n"), "{lua}");
    }
}
