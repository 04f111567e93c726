//! Store errors: a request no limit can decide, or a backend that cannot answer.

/// Why a store could not decide a request. A rejection is not an error: see
/// [`Decision::allowed`](tollgate_core::Decision::allowed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The request itself is invalid for its limit (a cost above the capacity, an overflow).
    #[error(transparent)]
    Limit(#[from] tollgate_core::Error),
    /// `check_all` was called with no checks.
    #[error("check_all needs at least one check")]
    NoChecks,
    /// The backend (Redis) failed or is unreachable.
    #[error("backend error: {0}")]
    Backend(String),
    /// The backend did not answer in time.
    #[error("backend did not answer within {0:?}")]
    Timeout(std::time::Duration),
    /// A key holds a value tollgate did not write (another type, or a malformed value).
    #[error("bad state: {0}")]
    BadState(String),
    /// The keys of one `check_all` live in different Redis Cluster slots.
    #[error(
        "the keys of one check_all must share a Redis Cluster hash tag to be checked atomically, \
         e.g. {{user42}}:minute and {{user42}}:day"
    )]
    CrossSlot,
    /// This store cannot decide this limit.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A call across several servers (keys in several Redis Cluster slots) failed part way: what
    /// the servers that answered decided, so that a failure policy neither counts their admissions
    /// twice nor leaves them counted for a request it denies. A [`Remote`](crate::Remote)'s answer
    /// to its failure policy; a store's own callers get the failure itself.
    #[error("{}", .0)]
    Partial(Box<crate::remote::Partial>),
    /// A reservation could not be made or settled (see [`Refusal`](crate::reservation::Refusal)):
    /// nothing was changed.
    #[error(transparent)]
    Refused(crate::reservation::Refusal),
}

impl StoreError {
    /// Whether the error is the backend's (unreachable, slow, failing) rather than the request's:
    /// the errors a failure policy answers for.
    #[must_use]
    pub fn is_backend(&self) -> bool {
        matches!(self, StoreError::Backend(_) | StoreError::Timeout(_) | StoreError::Partial(_))
    }
}

/// The Redis client's errors are the backend's: Redis cannot be used now, or not as configured
/// (the messages are the client's, in tollgate's words).
#[cfg(feature = "redis")]
impl From<tollgate_redis_client::Error> for StoreError {
    fn from(error: tollgate_redis_client::Error) -> Self {
        StoreError::Backend(error.to_string())
    }
}
