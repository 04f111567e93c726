//! The client's fake Redis server (`tollgate_redis_client::testkit::fake_redis`: a server whose
//! answers a test scripts), and what the store's tests have it answer besides.

pub use tollgate_redis_client::testkit::fake_redis::*;

use crate::redis::program::{REPLY_CHECK, REPLY_NOW};

/// What the decision script answers for one check that it admitted (limit 10, 9 left), at a
/// fixed server time.
#[must_use]
pub fn admitted() -> Answer {
    let mut values = vec![1, 10, 9, 0, 0, 1, 0];
    values.extend([1_700_000_000, 0]);
    debug_assert_eq!(values.len(), REPLY_CHECK + REPLY_NOW);
    Answer::Raw(resp::array(&values.into_iter().map(resp::int).collect::<Vec<_>>()))
}
