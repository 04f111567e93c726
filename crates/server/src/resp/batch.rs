//! A client's pipelined decisions decided together, on a store that does not decide in place
//! (Redis): one command after another, each a round trip, a pipeline of 16 `CL.THROTTLE`s took
//! 16 round trips and 16 wake-ups of the connection's task; decided together, their calls go out
//! to Redis in one write and the connection's task is woken once their replies are in.
//!
//! Which commands join: a run of lone ad-hoc decisions (`CL.THROTTLE`, `TG.CHECK`, `TG.PEEK`)
//! received together, each on a key no earlier command of the run names, at most [`MAX_BATCH`].
//! Decisions on different keys touch different state, so deciding them at once answers what
//! deciding them one after another would; a command on a key already in the run, or any other
//! command (`TG.RESET`, `TG.LIMIT` with its rules, an administrative command), ends the run and is
//! run after it, in its turn. The replies are written in the order the commands were received,
//! errors (a wrong argument) in their place.

use std::ops::Range;

use bytes::BytesMut;
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tollgate_resp::request::{Bounds, Decoder};

use super::commands;
use crate::app::App;

/// The most commands decided together.
pub(super) const MAX_BATCH: usize = 64;

/// The commands that may join a batch.
const JOINS: [&[u8]; 3] = [b"CL.THROTTLE", b"TG.CHECK", b"TG.PEEK"];

/// The key of the command framed in `input` at `ranges` if it may join a batch (see the module
/// docs), else `None`.
fn key<'a>(input: &'a [u8], ranges: &[Range<usize>]) -> Option<&'a [u8]> {
    let (name, key) = (ranges.first()?, ranges.get(1)?);
    let name = &input[name.clone()];
    JOINS.iter().any(|joins| name.eq_ignore_ascii_case(joins)).then(|| &input[key.clone()])
}

/// Whether the command framed at the start of `input` (its arguments at `first`, `used` bytes
/// long) and the one after it may be decided together: both may join a batch, on different keys.
/// Asked before a batch is made, so that a command that runs alone (a hot key's next command is
/// on the same key) costs one framing of the next command, and nothing allocated.
pub(super) fn joins(
    input: &[u8],
    first: &[Range<usize>],
    used: usize,
    frames: Bounds,
    lookahead: &mut Decoder,
) -> bool {
    let Some(first_key) = key(input, first) else { return false };
    let rest = &input[used..];
    // The same command again (a hot key's pipeline): on the same key, so it does not join; told
    // by comparing bytes, cheaper than framing it.
    if rest.starts_with(&input[..used]) {
        return false;
    }
    lookahead.reset();
    matches!(lookahead.decode(rest, frames), Ok(Some(_)))
        && key(rest, lookahead.args()).is_some_and(|next| next != first_key)
}

/// Decides the command framed at the start of `input` (its arguments at `first`, `used` bytes
/// long; one that [`joins`] the next) together with the commands after it that join it, appending
/// their replies to `output` in order. Returns how many bytes of `input` the batch took.
///
/// A batch takes no more commands once three times their bytes fill `room`: a reply is a few
/// dozen bytes, but an error may quote an argument, each byte that is not UTF-8 becoming U+FFFD's
/// three, so a batch of large wrong commands could otherwise add 64 such replies past the
/// connection's output bound.
pub(super) async fn run(
    app: &App,
    input: &[u8],
    (first, used): (&[Range<usize>], usize),
    frames: Bounds,
    room: usize,
    lookahead: &mut Decoder,
    output: &mut BytesMut,
) -> usize {
    let mut batch: Vec<Vec<&[u8]>> = vec![first.iter().map(|range| &input[range.clone()]).collect()];
    let mut taken = used;
    lookahead.reset();
    // `lookahead` is not the connection's decoder: a command that does not join is framed again
    // by the connection's in its turn (a partial command stays where it is).
    while batch.len() < MAX_BATCH && taken < input.len() && taken.saturating_mul(3) < room {
        let rest = &input[taken..];
        let Ok(Some(length)) = lookahead.decode(rest, frames) else { break };
        let Some(key) = key(rest, lookahead.args()) else { break };
        if batch.iter().any(|command| command[1] == key) {
            break;
        }
        batch.push(lookahead.args().iter().map(|range| &rest[range.clone()]).collect());
        taken += length;
    }
    if let [command] = batch.as_slice() {
        // These commands never close the connection.
        let _ = commands::execute(app, command, output).await;
        return taken;
    }
    let mut replies: Vec<BytesMut> = batch.iter().map(|_| BytesMut::new()).collect();
    // Each polled again only when woken (its reply in), not on every other's wake-up.
    let mut deciding: FuturesUnordered<_> =
        batch.iter().zip(replies.iter_mut()).map(|(command, reply)| commands::execute(app, command, reply)).collect();
    while deciding.next().await.is_some() {}
    drop(deciding);
    for reply in replies {
        output.extend_from_slice(&reply);
    }
    taken
}
