//! Carrying a key's use from one algorithm's state to another's ([`Store::carry`]): both keys'
//! shards locked for write (in `many`'s order), the old state taken out, its use charged to the
//! new one, in one step: no check of either key can come between.
//!
//! [`Store::carry`]: crate::Store::carry

use tollgate_core::Limit;

use super::MemoryStore;
use super::many::fresh;
use crate::{Check, StoreError};

impl MemoryStore {
    /// [`Store::carry`](crate::Store::carry) without a future.
    pub fn carry_sync(&self, scope: &str, key: &[u8], from: &Limit, to: &Limit) -> Result<u64, StoreError> {
        if from.algorithm() == to.algorithm() {
            return Ok(0);
        }
        let now = self.clock.now_ns();
        let old = self.fingerprint(&Check::new(key, from, 0).scoped(scope));
        let new = self.fingerprint(&Check::new(key, to, 0).scoped(scope));
        let (mut gcra, mut states) = (Vec::new(), Vec::new());
        for (fp, limit) in [(old, from), (new, to)] {
            if limit.algorithm() == tollgate_core::Algorithm::Gcra {
                gcra.push(self.gcra.shard_of(fp));
            } else {
                states.push(self.states.shard_of(fp));
            }
        }
        for shards in [&mut gcra, &mut states] {
            shards.sort_unstable();
            shards.dedup();
        }
        let mut guards = self.lock(&gcra, &states);
        let Some(mut taken) = self.take(&mut guards, old, from) else { return Ok(0) };
        let left = taken.check(now, from, 0)?.remaining;
        let units = from.capacity().saturating_sub(left).min(to.capacity());
        if units > 0 {
            let mut state = self.stored(&guards, new, to).unwrap_or_else(|| fresh(to));
            state.charge(now, to, units)?;
            self.write(&mut guards, new, to, state, now, &[new]);
        }
        Ok(units)
    }
}
