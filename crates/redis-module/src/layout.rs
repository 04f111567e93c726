//! The layout of a decision call's arguments and reply, shared by the script (`tollgate-store`'s
//! `lua/`, which reads it as Lua locals) and this module: every offset named once, with a version
//! both check.

macro_rules! version {
    () => {
        "4"
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
