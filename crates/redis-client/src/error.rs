//! The client's errors: [`CallError`], a call that failed, with what it may have done on the
//! server ([`Delivery`]: what exactly-once charging rests on, a call that may have run is never
//! sent again); [`Error`], the topology or a server unusable (opening, a probe).

use std::sync::Arc;

use redis::{ErrorKind, RedisError};

use crate::node::Node;
use crate::target::Address;

/// What a failed call may have done on the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// It was never written to a server: it did not run (no server known for it, its
    /// connection ended before it was written, the server's own limit on calls awaited).
    NotSent,
    /// A server answered with an error reply (the call's own: a script's error, a redirect
    /// followed too many times, `READONLY`; or its connection's `SELECT`): the call did not run
    /// past what that reply says.
    Answered,
    /// It may have run: written and not answered (a connection lost, a stall, a reply past its
    /// bounds), or failed where the client cannot tell. Never sent again.
    MayHaveRun,
}

/// A call that failed: the driver's error, and the server it came from when one was reached.
#[derive(Clone)]
pub struct CallError {
    error: RedisError,
    server: Option<Arc<Node>>,
}

impl CallError {
    pub(crate) fn new(error: RedisError, server: Option<Arc<Node>>) -> Self {
        CallError { error, server }
    }

    /// The driver's error (its code, `WRONGTYPE` or a script's own, and its detail).
    #[must_use]
    pub fn error(&self) -> &RedisError {
        &self.error
    }

    /// The server it came from, if one was reached.
    #[must_use]
    pub fn server(&self) -> Option<&Address> {
        self.server.as_ref().map(|node| &node.address)
    }

    /// The error in tollgate's words, naming the server (never a credential).
    #[must_use]
    pub fn explain(&self) -> String {
        self.server.as_ref().map_or_else(|| self.error.to_string(), |node| node.explain(&self.error))
    }

    /// What the call may have done on the server (see [`Delivery`]).
    #[must_use]
    pub fn delivery(&self) -> Delivery {
        if self.server.is_none() {
            // No server was chosen for it (no slot map, no primary named, a redirect to an
            // address that cannot be connected to): nothing was written.
            return Delivery::NotSent;
        }
        if matches!(self.error.kind(), ErrorKind::AuthenticationFailed | ErrorKind::InvalidClientConfig) {
            // Its connection could not be made (TLS, AUTH): no call went on it.
            return Delivery::NotSent;
        }
        if self.error.code().is_some() {
            return Delivery::Answered;
        }
        if self.error.is_io_error() && self.error.to_string().contains(crate::wire::NOT_SENT) {
            return Delivery::NotSent;
        }
        Delivery::MayHaveRun
    }
}

impl std::fmt::Debug for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallError")
            .field("error", &self.error)
            .field("server", &self.server())
            .field("delivery", &self.delivery())
            .finish()
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.explain())
    }
}

impl std::error::Error for CallError {}

/// Why Redis cannot be used, in tollgate's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The target's settings are refused (by the driver's reading of them): nothing connects.
    #[error("{0}")]
    Settings(String),
    /// No server answers as it should: the topology cannot be read, a primary does not answer,
    /// a cluster's map lacks slots.
    #[error("{0}")]
    Unavailable(String),
}
