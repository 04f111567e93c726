//! [`Options`]: what the middleware writes besides decisions, read by the layer, the service and
//! the response future.

/// What the middleware writes besides decisions.
#[derive(Debug, Clone, Copy)]
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
    /// Most shadow-ban fakes waiting at once for their route's latency (default
    /// [`DEFAULT_MAX_WAITING`](crate::shadow::DEFAULT_MAX_WAITING), 1,024); the fakes beyond
    /// are answered at once (`tollgate_shadow_ban_fakes_total{delay="over_cap"}`). 0: every fake
    /// at once.
    pub shadow_ban_max_waiting: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            headers_on_allowed: false,
            legacy_headers: false,
            routes: false,
            request_timeout: None,
            shadow_ban_max_waiting: crate::shadow::DEFAULT_MAX_WAITING,
        }
    }
}
