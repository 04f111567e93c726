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
}
