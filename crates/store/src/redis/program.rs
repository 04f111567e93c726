//! The script every decision runs: its Lua (`lua/`: what the algorithms share, one file per
//! algorithm named as tollgate-core's, and the entry, `decide.lua`) assembled after the layout of
//! its arguments and reply and the bounds it shares with tollgate-core, which [`crate::layout`]
//! defines once (for this script and for the native module) and both sides read by name, with a
//! version the script checks.
//!
//! It runs as a Redis Function where the server has them (Redis 7+): `FUNCTION LOAD` once per
//! server, then `FCALL`, so the algorithms' definitions run once per load, not once per call (a
//! script sent by `EVALSHA` runs its whole body on every call). A server without functions, or
//! whose ACL user may not call or load them, is served the same source by `EVALSHA`; the lone
//! checks the native module decides go to it where it is loaded (the client chooses the form per
//! server: `tollgate_redis_client::Script`).

pub use crate::layout::*;
use tollgate_redis_client::{Native, Script};

/// The script's body (after the layout): the Lua sources; it defines `decide(KEYS, ARGV)`,
/// `carry(KEYS, ARGV)`, `hold(KEYS, ARGV)` and `settle(KEYS, ARGV)`, each the entry of a script of
/// its own.
const BODY: &str = concat!(
    include_str!("lua/prelude.lua"),
    include_str!("lua/gcra.lua"),
    include_str!("lua/token_bucket.lua"),
    include_str!("lua/leaky_bucket.lua"),
    include_str!("lua/fixed_window.lua"),
    include_str!("lua/sliding_window.lua"),
    include_str!("lua/sub_window.lua"),
    include_str!("lua/sliding_log.lua"),
    include_str!("lua/decide.lua"),
    include_str!("lua/carry.lua"),
    include_str!("lua/hold.lua"),
    include_str!("lua/settle.lua"),
);

/// The native module's command, deciding the lone checks of its algorithms where it is loaded:
/// a server without it, or whose module refuses the call (another build's layout, an algorithm
/// it does not decide), gets them as the decisions' script.
const MODULE: Native = Native { command: MODULE_COMMAND, refusals: &["TOLLGATE_VERSION", "TOLLGATE_UNSUPPORTED"] };

/// The decisions' script (`decide`), the native module's calls falling back to it.
pub(crate) fn decide() -> Script {
    script("decide").with_native(MODULE)
}

/// The script whose entry is the Lua function `entry` of the body (`decide`, `carry`, `hold`):
/// a library named after its source (so builds with different scripts never replace each
/// other's on a shared server), and the same source for `EVAL`.
pub(crate) fn script(entry: &str) -> Script {
    // What the script shares with the Rust side besides the layout, said once: how long a
    // charge's marker lives, and the largest running total a charge may carry.
    let protocol = format!(
        "local REMEMBERED_MS = {}\nlocal MAX_TOTAL = {}\n",
        crate::remote::CHARGES_REMEMBERED.as_millis(),
        crate::remote::MAX_CHARGE_TOTAL
    );
    let constants = lua_constants();
    let eval = format!("{constants}{protocol}{BODY}return {entry}(KEYS, ARGV)\n");
    let sha1 = redis::Script::new(&eval).get_hash().to_string();
    let name = format!("tollgate_{}", &sha1[..12]);
    let function = format!("{name}_{entry}");
    let library =
        format!("#!lua name={name}\n{constants}{protocol}{BODY}redis.register_function('{function}', {entry})\n");
    Script::new(library, function, eval)
}

/// A call's arguments, written in the layout's order: every value names its offset within its
/// part (the header, a check, a charge, a refund, a lease), which debug builds check.
pub(super) struct Call {
    cmd: redis::Cmd,
    /// ARGV values written so far, and where the current part starts and ends.
    written: usize,
    base: usize,
    end: usize,
}

impl Call {
    /// `FCALL` of `script` on `keys`; the header comes next.
    pub(super) fn new(script: &Script, keys: &[Vec<u8>]) -> Self {
        let mut cmd = redis::cmd("FCALL");
        cmd.arg(script.function()).arg(keys.len());
        for key in keys {
            cmd.arg(key.as_slice());
        }
        Call { cmd, written: 0, base: 0, end: HEADER_ARGS }
    }

    /// `FCALL` of `script` (the settle script) on `record` and then `keys`, whose first arguments
    /// are `guard`'s (not part of the layout); the header comes next.
    pub(super) fn guarded(script: &Script, record: &[u8], keys: &[Vec<u8>], guard: &[&[u8]]) -> Self {
        let mut cmd = redis::cmd("FCALL");
        cmd.arg(script.function()).arg(keys.len() + 1).arg(record);
        for key in keys {
            cmd.arg(key.as_slice());
        }
        for value in guard {
            cmd.arg(*value);
        }
        Call { cmd, written: 0, base: 0, end: HEADER_ARGS }
    }

    /// `TOLLGATE.CHECK` (the native module's command) on `key`, one check; the header comes next.
    pub(super) fn module(key: &[u8]) -> Self {
        let mut cmd = redis::cmd(MODULE_COMMAND);
        cmd.arg(key);
        Call { cmd, written: 0, base: 0, end: HEADER_ARGS }
    }

    /// Starts the next part of `size` values ([`CHECK_ARGS`], [`CHARGE_ARGS`], [`REFUND_ARGS`],
    /// [`LEASE_ARGS`]), the previous one complete.
    pub(super) fn part(&mut self, size: usize) -> &mut Self {
        debug_assert_eq!(self.written, self.end, "a part of the call left incomplete");
        self.base = self.written;
        self.end = self.written + size;
        self
    }

    /// Writes the value at `offset` of the current part (1-based, as the layout's constants).
    pub(super) fn put(&mut self, offset: usize, value: impl redis::ToRedisArgs) -> &mut Self {
        debug_assert_eq!(self.base + offset, self.written + 1, "an argument written out of the layout's order");
        self.cmd.arg(value);
        self.written += 1;
        self
    }

    /// The limit and cost of a check, charge or refund (its first [`LIMIT_COST`] values).
    pub(super) fn limit(&mut self, limit: &tollgate_core::Limit, cost: u64) -> &mut Self {
        self.put(LIMIT_ALGORITHM, limit.algorithm().as_str())
            .put(LIMIT_COUNT, limit.count())
            .put(LIMIT_PERIOD, limit.period_ns())
            .put(LIMIT_BURST, limit.burst())
            .put(LIMIT_SLICES, limit.slices())
            .put(LIMIT_EMISSION, limit.emission_interval_ns())
            .put(LIMIT_TOLERANCE, limit.tolerance_ns())
            .put(LIMIT_COST, cost)
    }

    pub(super) fn into_cmd(self) -> redis::Cmd {
        debug_assert_eq!(self.written, self.end, "the call's last part left incomplete");
        self.cmd
    }
}

/// The script as `EVAL` runs it, and its SHA1 (for tests and benches that call it directly).
#[must_use]
pub fn eval_source() -> (String, String) {
    let script = decide();
    (script.eval().to_string(), script.sha1().to_string())
}

/// The script of the Lua entry `entry` (`decide`, `carry`, `hold`) as `EVAL` runs it, and its
/// SHA1 (for tests that call an entry directly).
#[must_use]
pub fn entry_eval_source(entry: &str) -> (String, String) {
    let script = script(entry);
    (script.eval().to_string(), script.sha1().to_string())
}

/// The script as a Redis Functions library, and the name of its function (for tests and benches
/// that call it directly).
#[must_use]
pub fn library_source() -> (String, String) {
    let script = decide();
    (script.library().to_string(), script.function().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_reaches_the_script_in_order() {
        assert!(LAYOUT_LUA.starts_with("local ARG_VERSION = 1\nlocal ARG_NOW_SEC = 2\n"));
        assert!(LAYOUT_LUA.contains("\nlocal CHARGE_ARGS = 16\n"));
        assert_eq!(HEADER_ARGS, ARG_REFUNDS);
        assert_eq!(CHECK_ARGS, CHECK_HOLD);
        assert_eq!(CHARGE_ARGS, CHARGE_VIEW);
        assert_eq!(REFUND_ARGS, REFUND_RESET);
        assert_eq!(LEASE_ARGS, LEASE_LIFETIME);
        let script = decide();
        assert!(script.library().starts_with("#!lua name=tollgate_"));
        assert!(script.library().contains(script.function()));
    }
}
