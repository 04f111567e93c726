//! Bodies with a clock: the client's request body must arrive whole within the request timeout
//! ([`Timed::deadline`]), and the upstream's response body may pause at most the upstream
//! timeout between two pieces ([`Timed::idle`]); past either, the body fails with [`TooSlow`].
//! The clock starts when the body is first read: time the proxy itself holds a request (a
//! `delay` rule waiting for its slot) is not the client's.
//! [`Watched`] tells when the request body has been sent (or given up): the upstream's time to
//! answer counts from then, so that a slow client is never blamed on the upstream.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::oneshot;
use tokio::time::{Instant, Sleep};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Who was too slow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    /// The client did not send its body within the request timeout.
    Client,
    /// The upstream paused its body longer than the upstream timeout.
    Upstream,
}

/// A body that did not come in time.
#[derive(Debug)]
pub(crate) struct TooSlow {
    pub(crate) side: Side,
    pub(crate) after: Duration,
}

impl std::fmt::Display for TooSlow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.side {
            Side::Client => write!(f, "the request body took longer than {} ms", self.after.as_millis()),
            Side::Upstream => write!(f, "the upstream's body paused longer than {} ms", self.after.as_millis()),
        }
    }
}

impl std::error::Error for TooSlow {}

/// `body`, failing once its clock runs out.
pub(crate) struct Timed<B> {
    inner: B,
    sleep: Pin<Box<Sleep>>,
    /// Whether the body has been read yet (the clock runs from then).
    started: bool,
    side: Side,
    after: Duration,
    /// Whether each frame restarts the clock.
    idle: bool,
}

impl<B> Timed<B> {
    /// `body`, which must end within `after` of its first read.
    pub(crate) fn deadline(body: B, after: Duration, side: Side) -> Self {
        Self::new(body, after, side, false)
    }

    /// `body`, which may pause at most `after` between two frames (and before its first).
    pub(crate) fn idle(body: B, after: Duration, side: Side) -> Self {
        Self::new(body, after, side, true)
    }

    fn new(body: B, after: Duration, side: Side, idle: bool) -> Self {
        Timed { inner: body, sleep: Box::pin(tokio::time::sleep(after)), started: false, side, after, idle }
    }
}

impl<B> Body for Timed<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if !this.started {
            this.started = true;
            this.sleep.as_mut().reset(Instant::now() + this.after);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if this.idle {
                    this.sleep.as_mut().reset(Instant::now() + this.after);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(error))) => Poll::Ready(Some(Err(error.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => match this.sleep.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(TooSlow { side: this.side, after: this.after })))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// `body`, which signals when it is dropped: hyper drops a request body once it is sent (at
/// once when there is none), or when the exchange fails.
pub(crate) struct Watched<B> {
    inner: B,
    done: Option<oneshot::Sender<()>>,
}

impl<B> Watched<B> {
    /// `body`, and what completes once it is dropped.
    pub(crate) fn new(body: B) -> (Self, oneshot::Receiver<()>) {
        let (done, dropped) = oneshot::channel();
        (Watched { inner: body, done: Some(done) }, dropped)
    }
}

impl<B> Drop for Watched<B> {
    fn drop(&mut self) {
        if let Some(done) = self.done.take() {
            let _ = done.send(());
        }
    }
}

impl<B: Body + Unpin> Body for Watched<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The [`TooSlow`] in `error`'s chain of causes, if any.
pub(crate) fn too_slow<'e>(error: &'e (dyn std::error::Error + 'static)) -> Option<&'e TooSlow> {
    let mut cause = Some(error);
    while let Some(error) = cause {
        if let Some(slow) = error.downcast_ref::<TooSlow>() {
            return Some(slow);
        }
        cause = error.source();
    }
    None
}
