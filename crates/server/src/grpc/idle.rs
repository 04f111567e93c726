//! What makes a gRPC connection idle: no request under way. HTTP/2 keepalive PINGs and their
//! answers are traffic, not requests, so a connection's bytes cannot tell; each service is
//! wrapped ([`Tracked`]) to count the requests of the connection it came on (found in the
//! request's extensions, where tonic puts the connection's [`ConnectionInfo`]), from the call
//! until the response's body is done or dropped. The listener (`listener.rs`) closes a
//! connection once it has had none for the idle bound.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use hyper::body::{Body as HttpBody, Frame, SizeHint};
use tokio::time::Instant;
use tonic::body::Body;
use tonic::server::NamedService;
use tonic::transport::server::TcpConnectInfo;
use tower_service::Service;

/// One connection's requests: how many are under way, and when the last one ended (or the
/// connection began).
#[derive(Debug)]
pub(super) struct Activity {
    state: Mutex<(usize, Instant)>,
}

impl Activity {
    pub(super) fn new() -> Arc<Self> {
        Arc::new(Activity { state: Mutex::new((0, Instant::now())) })
    }

    /// Since when the connection has had no request under way; `None` while one is.
    pub(super) fn idle_since(&self) -> Option<Instant> {
        let (under_way, since) = *self.state.lock().unwrap_or_else(PoisonError::into_inner);
        (under_way == 0).then_some(since)
    }

    /// A request begins; it ends when the guard is dropped.
    fn begin(self: &Arc<Self>) -> UnderWay {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).0 += 1;
        UnderWay(Arc::clone(self))
    }
}

/// A request under way on its connection, until dropped.
struct UnderWay(Arc<Activity>);

impl Drop for UnderWay {
    fn drop(&mut self) {
        let mut state = self.0.state.lock().unwrap_or_else(PoisonError::into_inner);
        *state = (state.0.saturating_sub(1), Instant::now());
    }
}

/// What tonic puts in each request's extensions: the peer's address (as tonic's own
/// `TcpConnectInfo`, put there too) and the connection's [`Activity`].
#[derive(Debug, Clone)]
pub(super) struct ConnectionInfo {
    pub(super) tcp: TcpConnectInfo,
    pub(super) activity: Arc<Activity>,
}

/// A service whose requests count as their connection's activity.
#[derive(Debug, Clone)]
pub(super) struct Tracked<S>(pub(super) S);

impl<S: NamedService> NamedService for Tracked<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<http::Request<Body>> for Tracked<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<http::Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<Body>) -> Self::Future {
        let info = request.extensions().get::<ConnectionInfo>().cloned();
        let under_way = info.map(|info| {
            request.extensions_mut().insert(info.tcp);
            info.activity.begin()
        });
        let response = self.0.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(match under_way {
                Some(under_way) => response.map(|body| Body::new(TrackedBody { body, _under_way: under_way })),
                None => response,
            })
        })
    }
}

/// A response body holding its request [`UnderWay`] until it is done (a stream such as the
/// health service's `Watch` is under way as long as it is open).
struct TrackedBody {
    body: Body,
    _under_way: UnderWay,
}

impl HttpBody for TrackedBody {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
