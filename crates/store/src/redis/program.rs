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
    include_str!("lua/calendar.lua"),
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
    /// The client's now (ns since the epoch), around which a calendar limit's windows are sent.
    now_ns: u64,
    /// A charge's instant, around which its calendar limit's windows are sent too.
    charge_ns: Option<u64>,
}

impl Call {
    /// `FCALL` of `script` on `keys`; the header comes next.
    pub(super) fn new(script: &Script, keys: &[Vec<u8>]) -> Self {
        let mut cmd = sized(keys);
        cmd.arg("FCALL");
        cmd.arg(script.function()).arg(keys.len());
        for key in keys {
            cmd.arg(key.as_slice());
        }
        Call { cmd, written: 0, base: 0, end: HEADER_ARGS, now_ns: 0, charge_ns: None }
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
        Call { cmd, written: 0, base: 0, end: HEADER_ARGS, now_ns: 0, charge_ns: None }
    }

    /// `TOLLGATE.CHECK` (the native module's command) on `key`, one check; the header comes next.
    pub(super) fn module(key: &[u8]) -> Self {
        let mut cmd = sized(std::slice::from_ref(&key));
        cmd.arg(MODULE_COMMAND);
        cmd.arg(key);
        Call { cmd, written: 0, base: 0, end: HEADER_ARGS, now_ns: 0, charge_ns: None }
    }

    /// Sets the client's now, around which calendar limits' windows are computed (the header's
    /// writer calls it: the store's clock, or this machine's when the script reads the server's).
    pub(super) fn client_now(&mut self, now_ns: u64) -> &mut Self {
        self.now_ns = now_ns;
        self
    }

    /// The client's now set by [`client_now`](Self::client_now).
    pub(super) fn client_now_ns(&self) -> u64 {
        self.now_ns
    }

    /// Sets the instant of the charge whose limit is written next (`None` for a check or refund).
    pub(super) fn charge_at(&mut self, at: Option<u64>) -> &mut Self {
        self.charge_ns = at;
        self
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
        let mut period = period_arg(limit, self.now_ns);
        if let Some(at) = self.charge_ns.filter(|_| limit.calendar().is_some()) {
            // A charge's windows around its own instant too: `cal LONGEST B1..B7 C1..C7`.
            for bound in calendar_bounds(limit, at) {
                period.push_str(&format!(" {bound}"));
            }
        }
        self.put(LIMIT_ALGORITHM, limit.algorithm().as_str())
            .put(LIMIT_COUNT, limit.count())
            .put(LIMIT_PERIOD, period)
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

/// An empty command with room for a call on `keys` of one check, the usual call (its arguments
/// would otherwise be grown into, one reallocation after another).
fn sized<K: AsRef<[u8]>>(keys: &[K]) -> redis::Cmd {
    let key_bytes: usize = keys.iter().map(|k| k.as_ref().len()).sum();
    redis::Cmd::with_capacity(3 + keys.len() + HEADER_ARGS + CHECK_ARGS, 256 + key_bytes)
}

/// A limit's period as the script reads it: its length in ns, or for a calendar period
/// `cal LONGEST B1 .. B7` (`lua/calendar.lua`): the unit's longest length, then seven consecutive
/// window starts in ns since the epoch, `now` in the third window, so that the script finds the
/// window of a server's now up to a window away from this one, the windows before and after it,
/// and a key's window written up to two windows ahead (a clock gone backwards).
#[must_use]
pub fn period_arg(limit: &tollgate_core::Limit, now: u64) -> String {
    if limit.calendar().is_none() {
        return limit.period_ns().to_string();
    }
    let mut text = format!("cal {}", limit.period_ns());
    for bound in calendar_bounds(limit, now) {
        text.push_str(&format!(" {bound}"));
    }
    text
}

/// Seven consecutive window starts of a calendar limit, `at` in the third window.
fn calendar_bounds(limit: &tollgate_core::Limit, at: u64) -> [u64; 7] {
    let (start, end) = limit.window_at(at);
    let before = |t: u64| limit.window_before(t).unwrap_or(0);
    let (b2, b5) = (before(start), limit.window_end(end));
    let b6 = limit.window_end(b5);
    [before(b2), b2, start, end, b5, b6, limit.window_end(b6)]
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
