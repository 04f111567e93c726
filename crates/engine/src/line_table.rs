//! [`LineTable`]: a map from a 64-bit fingerprint to a value, each entry on a cache line of its
//! own with its fingerprint, for the measured rates (see [`rates`](crate::rates)), whose keys are
//! looked up at random on every request: finding one reads one line, where a `HashMap` reads
//! its control bytes, then a bucket of 56 bytes that straddles two lines more often than not.
//!
//! Open addressing with linear probing, kept at most half full (a key found is about 1.5 slots
//! away on average, a key missing 2.5). Entries are removed only in bulk ([`LineTable::retain`],
//! for eviction, itself O(table)), by rebuilding the table: no tombstones, no backward shifts.

/// A slot: a fingerprint and its value (`None`: empty), on its own cache line.
#[derive(Debug)]
#[repr(align(64))]
struct Slot<V> {
    fingerprint: u64,
    value: Option<V>,
}

/// Values by fingerprint (see the module docs).
#[derive(Debug)]
pub(crate) struct LineTable<V> {
    /// A power of two long (or empty).
    slots: Vec<Slot<V>>,
    len: usize,
}

impl<V> Default for LineTable<V> {
    fn default() -> Self {
        LineTable { slots: Vec::new(), len: 0 }
    }
}

impl<V> LineTable<V> {
    /// The first slot `fingerprint` may be in. Its low bits pick the shard (see `sharded`): the
    /// slot is picked by the bits above.
    fn home(&self, fingerprint: u64) -> usize {
        #[allow(clippy::cast_possible_truncation)] // masked to the table's length
        let home = (fingerprint >> 8) as usize;
        home & (self.slots.len() - 1)
    }

    /// The slot holding `fingerprint`, if any.
    fn find(&self, fingerprint: u64) -> Option<usize> {
        if self.len == 0 {
            return None;
        }
        let mask = self.slots.len() - 1;
        let mut i = self.home(fingerprint);
        // At most half full: the probe ends at an empty slot.
        loop {
            let slot = &self.slots[i];
            match slot.value {
                None => return None,
                Some(_) if slot.fingerprint == fingerprint => return Some(i),
                Some(_) => i = (i + 1) & mask,
            }
        }
    }

    /// How many entries.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn get(&self, fingerprint: u64) -> Option<&V> {
        self.find(fingerprint).and_then(|i| self.slots[i].value.as_ref())
    }

    pub(crate) fn get_mut(&mut self, fingerprint: u64) -> Option<&mut V> {
        self.find(fingerprint).and_then(|i| self.slots[i].value.as_mut())
    }

    /// Adds `value` under `fingerprint`, which the table does not hold (see [`get_mut`](Self::get_mut)).
    pub(crate) fn insert(&mut self, fingerprint: u64, value: V) {
        if (self.len + 1) * 2 > self.slots.len() {
            self.grow();
        }
        self.place(fingerprint, value);
        self.len += 1;
    }

    /// Puts `value` in the first empty slot from its home (there is one: at most half full).
    fn place(&mut self, fingerprint: u64, value: V) {
        let mask = self.slots.len() - 1;
        let mut i = self.home(fingerprint);
        while self.slots[i].value.is_some() {
            i = (i + 1) & mask;
        }
        self.slots[i] = Slot { fingerprint, value: Some(value) };
    }

    /// Doubles the table (16 slots at first).
    fn grow(&mut self) {
        let length = (self.slots.len() * 2).max(16);
        self.rebuild(length, |_, _| true);
    }

    /// The table `length` slots long, with the entries `keep` keeps.
    fn rebuild(&mut self, length: usize, mut keep: impl FnMut(u64, &V) -> bool) {
        let old = std::mem::replace(&mut self.slots, Vec::with_capacity(length));
        self.slots.resize_with(length, || Slot { fingerprint: 0, value: None });
        self.len = 0;
        for slot in old {
            if let Some(value) = slot.value
                && keep(slot.fingerprint, &value)
            {
                self.place(slot.fingerprint, value);
                self.len += 1;
            }
        }
    }

    /// Keeps only the entries `keep` says to (the table keeps its length).
    pub(crate) fn retain(&mut self, keep: impl FnMut(u64, &V) -> bool) {
        self.rebuild(self.slots.len(), keep);
    }

    /// Every entry, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, &V)> + '_ {
        self.slots.iter().filter_map(|slot| Some((slot.fingerprint, slot.value.as_ref()?)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_found_again_through_growth_and_collisions() {
        let mut table = LineTable::default();
        // Fingerprints sharing their home slot (0: the bits from 8 up, masked) probe on.
        let colliding = |i: u64| i << 40;
        for i in 0..200u64 {
            table.insert(colliding(i), i * 10);
            table.insert((i << 8) | 1, i);
        }
        assert_eq!(table.len(), 400);
        for i in 0..200u64 {
            assert_eq!(table.get(colliding(i)), Some(&(i * 10)));
            assert_eq!(table.get((i << 8) | 1), Some(&i));
        }
        assert_eq!(table.get(1_000_000), None);
        *table.get_mut(colliding(3)).expect("held") += 1;
        assert_eq!(table.get(colliding(3)), Some(&31));
        assert!(table.slots.len() >= 800, "at most half full: {}", table.slots.len());
    }

    #[test]
    fn retain_drops_the_others_and_finds_the_rest() {
        let mut table = LineTable::default();
        for i in 0..100u64 {
            table.insert(i * 7, i);
        }
        table.retain(|_, v| v % 3 == 0);
        assert_eq!(table.len(), 34);
        assert_eq!(table.iter().count(), 34);
        for i in 0..100u64 {
            assert_eq!(table.get(i * 7).copied(), (i % 3 == 0).then_some(i), "{i}");
        }
    }

    #[test]
    fn an_empty_table_holds_nothing() {
        let mut table: LineTable<u8> = LineTable::default();
        assert_eq!(table.get(0), None);
        assert_eq!(table.get_mut(5), None);
        assert_eq!(table.iter().count(), 0);
        table.retain(|_, _| true);
        assert_eq!(table.len(), 0);
    }
}
