//! [`Store::hold`] on Redis: one call of the hold script (`lua/hold.lua`) on the key's hold key,
//! which shares the slot of the key's states (one hash tag), so that a decision reads it in the
//! same call (see `lua/decide.lua`).
//!
//! [`Store::hold`]: crate::Store::hold

use super::program::{Call, HOLD_NS};
use super::reply::script_error;
use super::{RedisStore, keys};
use crate::{MAX_HOLD_NS, StoreError};

impl RedisStore {
    /// Holds `key` in `scope` for `hold_ns` (at most [`MAX_HOLD_NS`]) from the script's now.
    pub(super) async fn hold_key_for(&self, scope: &str, key: &[u8], hold_ns: u64) -> Result<(), StoreError> {
        let keys = [keys::hold_key(&self.options.prefix, scope, key)?];
        let mut call = Call::new(&self.hold_script, &keys);
        self.header(&mut call, 0, 0, 0);
        call.part(HOLD_NS).put(HOLD_NS, hold_ns.min(MAX_HOLD_NS));
        let cmd = call.into_cmd();
        self.script_calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let reply =
            tokio::time::timeout(self.options.timeout, self.connection.run(&keys[0], &cmd, Some(&self.hold_script)))
                .await
                .map_err(|_| StoreError::Timeout(self.options.timeout))?
                .map_err(|failure| script_error(&failure, &keys))?;
        let reply: Vec<i64> = redis::from_redis_value(reply)
            .map_err(|e| StoreError::Backend(format!("the hold script answered something else than integers: {e}")))?;
        match reply.as_slice() {
            [_, _] => Ok(()),
            other => Err(StoreError::Backend(format!("the hold script answered {} integers, not 2", other.len()))),
        }
    }
}
