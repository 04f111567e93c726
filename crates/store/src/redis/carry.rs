//! [`Store::carry`] on Redis: one call of the carry script (`lua/carry.lua`) on the key's old and
//! new state keys, which share a slot (a key under two algorithms has one hash tag).
//!
//! [`Store::carry`]: crate::Store::carry

use tollgate_core::Limit;

use super::RedisStore;
use super::program::{CHECK_ARGS, CHECK_HOLD, Call};
use super::reply::script_error;
use crate::StoreError;

impl RedisStore {
    /// Carries `key`'s use in `scope` from its state under `from` to its state under `to`.
    pub(super) async fn carry_use(&self, scope: &str, key: &[u8], from: &Limit, to: &Limit) -> Result<u64, StoreError> {
        if from.algorithm() == to.algorithm() {
            return Ok(0);
        }
        let keys = [self.state_key(scope, key, from)?, self.state_key(scope, key, to)?];
        let mut call = Call::new(&self.carry_script, &keys);
        self.header(&mut call, 0, 0, 0);
        call.part(CHECK_ARGS).limit(from, 0).put(CHECK_HOLD, 0);
        call.part(CHECK_ARGS).limit(to, 0).put(CHECK_HOLD, 0);
        let cmd = call.into_cmd();
        self.script_calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let reply =
            tokio::time::timeout(self.options.timeout, self.connection.run(&keys[0], &cmd, Some(&self.carry_script)))
                .await
                .map_err(|_| StoreError::Timeout(self.options.timeout))?
                .map_err(|failure| script_error(&failure, &keys))?;
        let reply: Vec<i64> = redis::from_redis_value(reply)
            .map_err(|e| StoreError::Backend(format!("the carry script answered something else than integers: {e}")))?;
        match reply.as_slice() {
            [units, _, _] => u64::try_from(*units)
                .map_err(|_| StoreError::Backend(format!("the carry script answered {units} units"))),
            other => Err(StoreError::Backend(format!("the carry script answered {} integers, not 3", other.len()))),
        }
    }
}
