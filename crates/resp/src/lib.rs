//! # tollgate-resp
//!
//! RESP2, the protocol of Redis and of tollgate's RESP front end, spelled once for every side of
//! tollgate that speaks it:
//! - [`request`]: the server's framing of commands, bounded before any data is awaited;
//! - [`reply`]: the server's encoding of replies;
//! - [`command`]: a client's encoding of commands (arrays of bulk strings);
//! - [`value`]: a client's reading of replies, whole ([`Value`]) or skimmed for the one integer a
//!   load generator needs ([`value::skim`]), and [`value::read`] for blocking test clients.

pub mod command;
pub mod reply;
pub mod request;
pub mod value;

pub use value::{ReplyError, Value};
