//! [`ResponseFuture`]: the future of a [`RateLimit`](crate::RateLimit) call.
//!
//! Most requests are decided in `call` itself (the memory store decides in place): they are
//! either answered at once or passed on, and the future is then the inner service's own, plus
//! the header fields to add. Only requests that must wait (a remote store, a `delay` rule, a
//! `count_status` rule settled after the response) get a task of their own. Such a request's
//! call of the inner service is an [`Answering`]: when its client leaves, the call goes on to its
//! status, which settles the request.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum_core::body::Body;
use bytes::Bytes;
use http::Response;
use pin_project_lite::pin_project;
use tollgate_edge::http::rate_limit_fields;
use tollgate_engine::{Fields, Unsettled};
use tollgate_store::Store;

use crate::options::Options;
use crate::shadow::Learning;
use crate::usage::Metered;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A boxed response future, for the requests that must wait.
pub(crate) type Waiting<E> = Pin<Box<dyn Future<Output = Result<Response<Body>, E>> + Send>>;

pin_project! {
    /// Resolves to the service's response, or to the middleware's own (429, shadow-ban, 400, 503).
    pub struct ResponseFuture<F, E> {
        #[pin]
        state: State<F, E>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, E> {
        // Answered by the middleware.
        Answered { response: Option<Response<Body>> },
        // Passed on: the inner service's future, the fields to add to its response (boxed:
        // rarely asked for, and they would make every future larger), and what a shadow-ban
        // rule learns of it (boxed: only under such a rule).
        Passed { #[pin] future: F, fields: Option<Box<Fields>>, options: Options, learning: Option<Box<Learning>> },
        // Still to be decided or settled.
        Waiting { future: Waiting<E> },
    }
}

impl<F, E> ResponseFuture<F, E> {
    pub(crate) fn answered(response: Response<Body>) -> Self {
        ResponseFuture { state: State::Answered { response: Some(response) } }
    }

    pub(crate) fn passed(
        future: F,
        fields: Option<Box<Fields>>,
        options: Options,
        learning: Option<Box<Learning>>,
    ) -> Self {
        ResponseFuture { state: State::Passed { future, fields, options, learning } }
    }

    pub(crate) fn waiting(future: Waiting<E>) -> Self {
        ResponseFuture { state: State::Waiting { future } }
    }
}

/// The inner service's response as the middleware returns it, with the `RateLimit` fields of an
/// admitted request when the options ask for them; learned first, as the service wrote it, by
/// the shadow-ban rules that learn it.
pub(crate) fn finish<RB>(
    response: Response<RB>,
    fields: Option<&Fields>,
    options: Options,
    learning: Option<&Learning>,
) -> Response<Body>
where
    RB: http_body::Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    if let Some(learning) = learning {
        let sized = response.body().size_hint().exact().is_some()
            || response.headers().contains_key(http::header::CONTENT_LENGTH);
        learning.record(response.status(), response.headers(), sized);
    }
    let mut response = response.map(Body::new);
    if let Some(fields) = fields {
        rate_limit_fields(
            response.headers_mut(),
            &fields.policy,
            &fields.limit,
            &fields.decision,
            options.legacy_headers,
        );
    }
    response
}

impl<F, RB, E> Future for ResponseFuture<F, E>
where
    F: Future<Output = Result<Response<RB>, E>>,
    RB: http_body::Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    type Output = Result<Response<Body>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Answered { response } => {
                Poll::Ready(Ok(response.take().expect("ResponseFuture polled after it completed")))
            }
            StateProj::Passed { future, fields, options, learning } => match future.poll(cx) {
                Poll::Ready(Ok(response)) => {
                    Poll::Ready(Ok(finish(response, fields.as_deref(), *options, learning.as_deref())))
                }
                Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
                Poll::Pending => Poll::Pending,
            },
            StateProj::Waiting { future } => future.as_mut().poll(cx),
        }
    }
}

/// The inner service's call for a request whose `count_status` reservations wait for its status:
/// resolves to the response and the reservations, to be settled with its status. Dropped before
/// (the client left, the server's request timeout ended the request), the call goes on, on a task
/// of its own, and its status settles them all the same: the service acts on the request whether
/// or not anyone waits for its answer (a login's password is checked), so an attacker hanging up
/// after each guess is counted as one who waits. Only a call that comes to no status (it fails, or
/// panics) is refunded. A call unwinding from its own panic cannot be polled again: refunded.
/// Reservations whose cost is read from the response settle from its body, read as
/// [`Metered`]'s drop reads a body whose client left (a JSON body to its end, a stream not at all).
pub(crate) struct Answering<F, S: Store + 'static> {
    call: Option<(Pin<Box<F>>, Unsettled<S>)>,
    /// Takes a dropped call to its status on a task (a function: the bounds it needs are `new`'s).
    go_on: fn(Pin<Box<F>>, Unsettled<S>),
}

impl<F, RB, E, S> Answering<F, S>
where
    F: Future<Output = Result<Response<RB>, E>> + Send + 'static,
    RB: http_body::Body<Data = Bytes> + Send + 'static,
    S: Store + 'static,
{
    pub(crate) fn new(call: F, unsettled: Unsettled<S>) -> Self {
        let go_on: fn(Pin<Box<F>>, Unsettled<S>) = |call, unsettled| {
            let costs = unsettled.response_costs();
            if costs.is_empty() {
                unsettled.settle_later(async move { call.await.ok().map(|response| response.status().as_u16()) });
                return;
            }
            // A cost read from the response: its body is read as if the client were there (a
            // JSON body whole, a stream cut at once; see `Metered`'s drop). No runtime: refunded.
            let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
            runtime.spawn(async move {
                if let Ok(response) = call.await {
                    drop(Metered::wrap(response, unsettled, costs));
                }
            });
        };
        Answering { call: Some((Box::pin(call), unsettled)), go_on }
    }
}

impl<F, RB, E, S> Future for Answering<F, S>
where
    F: Future<Output = Result<Response<RB>, E>>,
    S: Store + 'static,
{
    type Output = Result<(Response<RB>, Unsettled<S>), E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let (call, _) = self.call.as_mut().expect("Answering polled after it completed");
        let Poll::Ready(answer) = call.as_mut().poll(cx) else { return Poll::Pending };
        let (_, unsettled) = self.call.take().expect("taken only here");
        // A failed call has no status: its reservations, dropped, are refunded.
        Poll::Ready(answer.map(|response| (response, unsettled)))
    }
}

impl<F, S: Store + 'static> Drop for Answering<F, S> {
    fn drop(&mut self) {
        if let Some((call, unsettled)) = self.call.take()
            && !std::thread::panicking()
        {
            (self.go_on)(call, unsettled);
        }
    }
}

impl<F, E> std::fmt::Debug for ResponseFuture<F, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
