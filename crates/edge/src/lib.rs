//! The protocol edge: how a decision is told to a client, in one room below every front end (the
//! server's RESP commands, HTTP API and gRPC service; the tower middleware and `tollgate proxy`).
//! The front ends parse, ask the engine, and hand what it decided to this module:
//!
//! - the values ([`throttle_reply`], [`check_reply`], [`policy_field`], [`rls_duration`], ...),
//!   computed once so that every front end rounds alike;
//! - [`http`]: the HTTP header fields written into a `HeaderMap` (`RateLimit-Policy`,
//!   `RateLimit`, legacy `X-RateLimit-*`, `Retry-After`) and the responses a front end answers on
//!   its own: the 429 with its RFC 9457 problem body, the other problems, a shadow-ban's bare
//!   fake success.
//!
//! It is a crate of its own, below the engine and the middleware, because it needs nothing of
//! them: it renders tollgate-core's [`Decision`](tollgate_core::Decision) and
//! [`Limit`](tollgate_core::Limit), so a front end's walk from socket to store visits the engine
//! once, and a change to what clients read lands here and nowhere else.

pub mod http;
mod values;

pub use values::*;
