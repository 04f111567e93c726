//! [`Store::hold`] on Redis: one call of the hold script (`lua/hold.lua`) on the key's hold key,
//! which shares the slot of the key's states (one hash tag), so that a decision reads it in the
//! same call (see `lua/decide.lua`).
//!
//! The call runs on a task of its own, awaited: a caller that stops waiting (the client that put
//! the key over hung up, dropping its request's future) does not stop the write. Dropped with its
//! caller, a call still queued on the connection, or waiting for the script's library to load
//! first, would never be sent, and no other node would hold the key.
//!
//! [`Store::hold`]: crate::Store::hold

use super::program::{Call, HOLD_NS};
use super::reply::script_error;
use super::{RedisStore, keys};
use crate::{MAX_HOLD_NS, StoreError};

impl RedisStore {
    /// Holds `key` in `scope` for `hold_ns` (at most [`MAX_HOLD_NS`]) from the script's now, to
    /// the end of the call whether or not its caller still waits (see the module docs).
    pub(super) async fn hold_key_for(&self, scope: &str, key: &[u8], hold_ns: u64) -> Result<(), StoreError> {
        let hold_key = keys::hold_key(&self.options.prefix, scope, key)?;
        let mut call = Call::new(&self.hold_script, std::slice::from_ref(&hold_key));
        self.header(&mut call, 0, 0, 0);
        call.part(HOLD_NS).put(HOLD_NS, hold_ns.min(MAX_HOLD_NS));
        let cmd = call.into_cmd();
        self.script_calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let store = self.clone();
        let write = async move { store.write_hold(&hold_key, &cmd).await };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => runtime
                .spawn(write)
                .await
                .unwrap_or_else(|ended| Err(StoreError::Backend(format!("the hold's write ended: {ended}")))),
            Err(_) => write.await,
        }
    }

    /// The hold script's call `cmd` on `hold_key`, its reply checked.
    async fn write_hold(&self, hold_key: &[u8], cmd: &redis::Cmd) -> Result<(), StoreError> {
        let keys = [hold_key.to_vec()];
        let reply =
            tokio::time::timeout(self.options.timeout, self.connection.run(hold_key, cmd, Some(&self.hold_script)))
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
