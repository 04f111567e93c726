//! [`Options`]: what the middleware writes besides decisions, read by the layer, the service and
//! the response future.

/// What the middleware writes besides decisions.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// Also put the `RateLimit` fields on allowed responses.
    pub headers_on_allowed: bool,
    /// Also write the legacy `X-RateLimit-Limit/Remaining/Reset` headers.
    pub legacy_headers: bool,
    /// Pass requests a `route` rule mitigates to the inner service with a [`Quarantine`]
    /// extension naming the upstream (`tollgate proxy` forwards them there). Off, they are
    /// answered 429: an inner service that ignored the extension would serve them. Read when the
    /// layer builds its engine ([`RateLimitLayer::with_options`](crate::RateLimitLayer::with_options)); an engine built elsewhere
    /// routes as its builder said ([`EngineBuilder::routes`](tollgate_engine::EngineBuilder::routes)).
    ///
    /// [`Quarantine`]: crate::Quarantine
    pub routes: bool,
    /// The server's time limit for a whole request (its request timeout), if it has one: a
    /// `delay` that would not end within what is left of it is refused at once (429, nothing
    /// charged) rather than spent on a request the server ends first. `tollgate proxy` sets its
    /// `--http-request-timeout`.
    pub request_timeout: Option<std::time::Duration>,
}
