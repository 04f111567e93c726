//! [`ResponseFuture`]: the future of a [`RateLimit`](crate::RateLimit) call.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum_core::body::Body;
use http::Response;

/// Resolves to the service's response, or to the middleware's own (429, shadow-ban).
pub struct ResponseFuture<E> {
    pub(crate) inner: Pin<Box<dyn Future<Output = Result<Response<Body>, E>> + Send>>,
}

impl<E> Future for ResponseFuture<E> {
    type Output = Result<Response<Body>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<E> std::fmt::Debug for ResponseFuture<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
