//! A key's pending charges (what the node admitted locally and the remote has not confirmed):
//! numbered so that the remote applies each unit once however they are merged and resent, kept
//! few, and not sent forever under one identity.
//!
//! **Numbered by their running total.** The node numbers its charges to a key by the running total
//! of their costs under one origin id ([`Origin`](crate::remote::Origin)); the remote keeps the
//! highest total it applied and applies of a charge only what lies above it. A call whose reply
//! was lost may have run, so the charges it carried may be on the remote or not; merged with newer
//! ones (the merged charge carries the later total and the sum of the costs), only the part the
//! remote had not applied counts. Before, a merged charge carried the later *sequence* and its
//! whole cost: after a call that timed out having run (the remote's mark at the tenth charge), a
//! merge of the ten with the eleventh made the remote apply all eleven again.
//!
//! **Kept few.** At most [`MAX_CHARGES`] per key, so that a long outage costs bounded memory: past
//! that the oldest pair that merges exactly merges, or else the oldest pair (see `merge`). Merging
//! never costs exactness of the count; a merged charge applied in part counts at the remote's now
//! (never before its own instant: stricter, for that part).
//!
//! **Not sent forever under one identity.** The remote remembers what it applied for
//! [`CHARGES_REMEMBERED`](crate::remote::CHARGES_REMEMBERED) after applying it. A charge first sent
//! longer ago than [`RESEND_HORIZON`](crate::remote::RESEND_HORIZON), never confirmed (every call
//! that carried it failed), is not sent under its total again: the key's charges are numbered anew
//! under another origin id. If a call that carried them did run, they count twice: an under-grant
//! of those charges, after an outage longer than the horizon that began with a lost reply, never
//! an over-grant.

use tollgate_core::Limit;

use super::merge::{later_part, merge};
use crate::remote::MAX_CHARGE_TOTAL;

/// A charge not yet confirmed by the remote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pending {
    /// When it was admitted (remote's clock).
    pub(crate) at: u64,
    pub(crate) cost: u64,
    /// Increasing per ledger: a reply confirms the charges up to the ones it carried.
    pub(crate) seq: u64,
    /// The running total of the key's charges under its origin id, this one's cost included.
    pub(crate) total: u64,
    /// When a call first carried it (remote's clock; 0: never).
    pub(crate) sent_at: u64,
}

/// Charges kept per key.
pub(crate) const MAX_CHARGES: usize = 64;

/// The running total past which a key's charges are numbered anew, as past the resend horizon
/// (half what the remote can count, [`MAX_CHARGE_TOTAL`]: 2^52 units charged to one key).
const RENUMBER_ABOVE: u64 = MAX_CHARGE_TOTAL / 2;

/// How a key's charges are numbered: kept while the ledger follows the key (past its debts: the
/// remote remembers the totals it applied, so a later charge continues them).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Numbering {
    /// The origin id the charges are sent under (0: none yet).
    pub(crate) origin: u64,
    /// The running total of the charges numbered under it.
    pub(crate) total: u64,
}

/// A key's pending charges (in sequence order, and so of total) with their numbering.
pub(crate) struct Charges<'a> {
    pub(crate) list: &'a mut Vec<Pending>,
    pub(crate) numbering: &'a mut Numbering,
}

impl Charges<'_> {
    /// Records `cost` admitted at `at` as charge `seq`; `origin` gives a new origin id when one is
    /// needed.
    pub(crate) fn push(&mut self, limit: &Limit, at: u64, cost: u64, seq: u64, origin: impl FnOnce() -> u64) {
        if self.numbering.origin == 0 || self.numbering.total.saturating_add(cost) > RENUMBER_ABOVE {
            self.renumber(origin());
        }
        self.numbering.total += cost;
        self.list.push(Pending { at, cost, seq, total: self.numbering.total, sent_at: 0 });
        compact(limit, self.list);
    }

    /// Readies the charges for a call sent at `now`: numbered anew under `origin()` if one was
    /// first sent longer than `horizon` ago, then all marked sent.
    pub(crate) fn send(&mut self, now: u64, horizon: u64, origin: impl FnOnce() -> u64) {
        if self.list.iter().any(|c| c.sent_at != 0 && now.saturating_sub(c.sent_at) > horizon) {
            self.renumber(origin());
        }
        for charge in self.list.iter_mut().filter(|c| c.sent_at == 0) {
            charge.sent_at = now.max(1);
        }
    }

    /// Withdraws `by` of charge `i` (a reservation that did not count), and the charge if nothing
    /// is left of it. The totals of charges never sent follow; a charge sent keeps its total (the
    /// remote may hold it: then it keeps what it applied, an under-grant).
    pub(crate) fn withdraw(&mut self, i: usize, by: u64) {
        let by = by.min(self.list[i].cost);
        self.list[i].cost -= by;
        if self.list[i..].iter().all(|c| c.sent_at == 0) {
            for charge in &mut self.list[i..] {
                charge.total -= by;
            }
            self.numbering.total -= by;
        }
        if self.list[i].cost == 0 {
            self.list.remove(i);
        }
    }

    /// A reply confirmed the charges of a call, the latest of them charge `seq`, with running total
    /// `total` under `origin`: the remote holds every unit of `origin` up to `total`. Those charges
    /// go, and of a charge merged since from some of them and later ones only the later part stays
    /// (see `merge::later_part`): kept whole, the node would count the confirmed part twice (in
    /// the remote's snapshot and in its debt), and tell the remote so ([`known_remaining`]), which
    /// would charge it again. Renumbered since (the totals no longer compare), by sequence alone.
    ///
    /// [`known_remaining`]: crate::remote::Charge::known_remaining
    pub(crate) fn confirm(&mut self, limit: &Limit, origin: u64, seq: u64, total: u64) {
        let comparable = self.numbering.origin == origin;
        self.list.retain_mut(|charge| {
            if charge.seq <= seq || (comparable && charge.total <= total) {
                return false;
            }
            if comparable && charge.total.saturating_sub(charge.cost) < total {
                *charge = later_part(limit, *charge, charge.total - total);
            }
            true
        });
    }

    /// Every charge numbered anew under `origin`, as never sent.
    fn renumber(&mut self, origin: u64) {
        let numbering = &mut *self.numbering;
        *numbering = Numbering { origin, total: 0 };
        for charge in self.list.iter_mut() {
            numbering.total += charge.cost;
            (charge.total, charge.sent_at) = (numbering.total, 0);
        }
    }
}

/// Brings `charges` back to [`MAX_CHARGES`] by merging the oldest pair that merges exactly, or
/// else the oldest pair.
fn compact(limit: &Limit, charges: &mut Vec<Pending>) {
    while charges.len() > MAX_CHARGES {
        let pick = (0..charges.len() - 1).find(|&i| merge(limit, charges[i], charges[i + 1]).1).unwrap_or(0);
        let (merged, _) = merge(limit, charges[pick], charges[pick + 1]);
        charges[pick] = merged;
        charges.remove(pick + 1);
    }
}

#[cfg(test)]
mod tests {
    use tollgate_core::Algorithm;

    use super::*;

    const SEC: u64 = 1_000_000_000;
    const T0: u64 = 1_700_000_000 * SEC;

    #[test]
    fn compacting_keeps_the_cost_and_the_totals_and_merges_within_a_window_first() {
        let limit = Limit::per_minute(100).algorithm(Algorithm::FixedWindow).build().unwrap();
        // Two windows' worth: the oldest window's charges merge among themselves first.
        let (mut list, mut numbering) = (Vec::new(), Numbering::default());
        let mut charges = Charges { list: &mut list, numbering: &mut numbering };
        for i in 0..MAX_CHARGES as u64 + 10 {
            charges.push(&limit, T0 + i * SEC, 1 + i % 2, i + 1, || 7);
        }
        assert_eq!(list.len(), MAX_CHARGES);
        assert_eq!(list.iter().map(|c| c.cost).sum::<u64>(), numbering.total);
        assert!(list.windows(2).all(|w| w[0].seq < w[1].seq && w[1].total - w[0].total == w[1].cost), "{list:?}");
        assert_eq!(list[0].total, list[0].cost);
    }

    #[test]
    fn charges_are_numbered_anew_past_the_resend_horizon_and_when_withdrawn_unsent() {
        let limit = Limit::per_hour(100).build().unwrap();
        let (mut list, mut numbering) = (Vec::new(), Numbering::default());
        let mut charges = Charges { list: &mut list, numbering: &mut numbering };
        charges.push(&limit, T0, 2, 1, || 7);
        charges.send(T0, SEC, || unreachable!("within the horizon"));
        charges.push(&limit, T0, 3, 2, || unreachable!("an origin already"));
        charges.push(&limit, T0, 4, 3, || unreachable!("an origin already"));
        // The third, never sent, is lowered: its total follows; the first, sent, keeps its own.
        charges.withdraw(2, 1);
        charges.withdraw(0, 1);
        let totals: Vec<(u64, u64)> = charges.list.iter().map(|c| (c.cost, c.total)).collect();
        assert_eq!((totals, charges.numbering.origin), (vec![(1, 2), (3, 5), (3, 8)], 7));
        charges.send(T0 + SEC / 2, SEC, || unreachable!("within the horizon"));
        charges.send(T0 + 2 * SEC, SEC, || 8);
        let sent: Vec<(u64, u64)> = list.iter().map(|c| (c.total, c.sent_at)).collect();
        let at = T0 + 2 * SEC;
        assert_eq!((sent, numbering.origin, numbering.total), (vec![(1, at), (4, at), (7, at)], 8, 7));
    }

    #[test]
    fn a_reply_confirms_up_to_its_running_total_and_by_sequence_once_renumbered() {
        let limit = Limit::per_hour(100).build().unwrap();
        let t = limit.emission_interval_ns();
        let (mut list, mut numbering) = (Vec::new(), Numbering::default());
        let mut charges = Charges { list: &mut list, numbering: &mut numbering };
        // Three sent (totals 1, 3, 6), then a fourth merged with the third (seq 4, total 10).
        charges.push(&limit, T0, 1, 1, || 7);
        charges.push(&limit, T0, 2, 2, || unreachable!("an origin already"));
        charges.push(&limit, T0, 3, 3, || unreachable!("an origin already"));
        charges.send(T0, SEC, || unreachable!("within the horizon"));
        charges.push(&limit, T0, 4, 4, || unreachable!("an origin already"));
        let merged = merge(&limit, charges.list[2], charges.list[3]).0;
        charges.list.truncate(2);
        charges.list.push(merged);
        // The call carried the three: the first two go, of the merged one its last 4 units stay, at
        // the instant they count from once the 3 before them are applied.
        charges.confirm(&limit, 7, 3, 6);
        let left: Vec<(u64, u64, u64)> = charges.list.iter().map(|c| (c.cost, c.total, c.at)).collect();
        assert_eq!(left, vec![(4, 10, T0 + 3 * t)]);
        // Renumbered since: totals no longer compare, sequences do.
        charges.push(&limit, T0, 5, 5, || unreachable!("an origin already"));
        charges.renumber(8);
        charges.confirm(&limit, 7, 4, 1_000);
        let left: Vec<(u64, u64)> = charges.list.iter().map(|c| (c.cost, c.seq)).collect();
        assert_eq!(left, vec![(5, 5)]);
    }
}
