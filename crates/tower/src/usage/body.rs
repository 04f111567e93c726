//! [`Metered`]: a response body passed on unchanged while its usage is read, settling the
//! request's reservations at its end, or when it is dropped before (see the module docs of
//! [`usage`](super)).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use http_body::{Frame, SizeHint};
use tollgate_engine::{Actual, Unsettled};
use tollgate_rules::ResponseCost;
use tollgate_store::Store;

use super::Reader;
use super::asked::{Unasked, UsageAsked};

/// A settlement under way, polled by the body before it passes its end on.
type Settling = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The longest a response whose client left is read on for its usage (see [`Metered`]'s drop).
pub const MAX_READ_ON: Duration = Duration::from_secs(300);

/// The most bytes of a response whose client left read on for its usage: 64 MiB.
pub const MAX_READ_ON_BYTES: u64 = 64 << 20;

/// Reads the rest of a body whose client left, then settles (a function: the bounds it needs are
/// `wrap`'s).
type ReadOn<B, S> = fn(Pin<Box<B>>, Reader, Settle<S>) -> Settling;

/// A response body read for its usage on the way through (see [`usage`](super)).
pub struct Metered<B, S: Store + 'static> {
    /// The body (taken when it is dropped early, to be read on).
    body: Option<Pin<Box<B>>>,
    reader: Reader,
    /// What is still to settle (until the body ends or is dropped).
    settle: Option<Settle<S>>,
    settling: Option<Settling>,
    /// The body's last frame, held while the settlement it ended runs (a body that says it has
    /// ended may not be polled again: a server writing an announced length stops at it).
    last: Option<Frame<Bytes>>,
    /// The end was passed on.
    done: bool,
    read_on: ReadOn<B, S>,
    /// Takes out of the stream the usage-only chunk the front end asked for ([`UsageAsked`]).
    unasked: Option<Unasked>,
}

/// A request's reservations, and what its response's head said.
struct Settle<S: Store + 'static> {
    unsettled: Unsettled<S>,
    status: u16,
    costs: Vec<ResponseCost>,
    /// `(name, value)` of each header cost: a decimal integer, or nothing usable.
    headers: Vec<(String, Option<u64>)>,
}

impl<S: Store + 'static> Settle<S> {
    /// Settles with what `reader` read; `whole`: the body was read to its end (else each usage
    /// field counts at least what it said). An error (a status of 400 or more) that says no
    /// count used nothing: its estimate is given back (an upstream's outage does not spend its
    /// clients' budgets); a success that says none keeps it.
    fn settling(self, reader: &Reader, whole: bool) -> Settling {
        let failed = self.status >= 400;
        let actuals: Vec<(ResponseCost, Actual)> = self
            .costs
            .into_iter()
            .filter_map(|from| {
                let actual = match &from {
                    ResponseCost::Usage(field) => match reader.usage().get(field) {
                        Some(said) if whole => Actual::Final(said),
                        Some(said) => Actual::AtLeast(said),
                        None if failed && reader.readable() => Actual::Final(0),
                        None => return None,
                    },
                    ResponseCost::Header(name) => match self.headers.iter().find(|(n, _)| n == name)?.1 {
                        Some(said) => Actual::Final(said),
                        None if failed => Actual::Final(0),
                        None => return None,
                    },
                };
                Some((from, actual))
            })
            .collect();
        let actual = move |from: &ResponseCost| actuals.iter().find(|(c, _)| c == from).map(|&(_, a)| a);
        Box::pin(self.unsettled.complete_with(self.status, actual))
    }
}

impl<B, S> Metered<B, S>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    S: Store + 'static,
{
    /// `response`, its body metered for `unsettled`'s rules whose cost it says (`costs`).
    pub fn wrap(response: Response<B>, unsettled: Unsettled<S>, costs: Vec<ResponseCost>) -> Response<Self> {
        let header = |name| response.headers().get(name).map(http::HeaderValue::as_bytes);
        let reader = Reader::encoded_as(header(http::header::CONTENT_TYPE), header(http::header::CONTENT_ENCODING));
        let headers = costs
            .iter()
            .filter_map(|from| match from {
                ResponseCost::Header(name) => {
                    let value = response.headers().get(name.as_str()).and_then(|v| v.to_str().ok());
                    Some((name.clone(), value.and_then(|v| v.trim().parse::<u64>().ok())))
                }
                ResponseCost::Usage(_) => None,
            })
            .collect();
        let status = response.status().as_u16();
        let settle = Settle { unsettled, status, costs, headers };
        let unasked = (reader.is_stream() && response.extensions().get::<UsageAsked>().is_some()).then(Unasked::new);
        let mut response = response;
        if unasked.is_some() {
            // The stream passed on is shorter than the upstream's: its length goes.
            response.headers_mut().remove(http::header::CONTENT_LENGTH);
        }
        response.map(|body| Metered {
            body: Some(Box::pin(body)),
            reader,
            settle: Some(settle),
            settling: None,
            last: None,
            done: false,
            read_on: read_on::<B, S>,
            unasked,
        })
    }
}

/// Reads the rest of `body` into `reader` (within [`MAX_READ_ON`] and [`MAX_READ_ON_BYTES`], and
/// while the reader still reads it), then settles: whole if it came to its end.
fn read_on<B, S>(mut body: Pin<Box<B>>, mut reader: Reader, settle: Settle<S>) -> Settling
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    S: Store + 'static,
{
    Box::pin(async move {
        let reading = async {
            let mut read = 0u64;
            while reader.reading() && read <= MAX_READ_ON_BYTES {
                match std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
                    Some(Ok(frame)) => {
                        if let Some(data) = frame.data_ref() {
                            read += data.len() as u64;
                            reader.feed(data);
                        }
                    }
                    None => return true,
                    Some(Err(_)) => return false,
                }
            }
            false
        };
        let ended = tokio::time::timeout(MAX_READ_ON, reading).await.unwrap_or(false);
        drop(body);
        reader.finish();
        let whole = ended && reader.whole();
        settle.settling(&reader, whole).await;
    })
}

impl<B, S> http_body::Body for Metered<B, S>
where
    B: http_body::Body<Data = Bytes>,
    S: Store + 'static,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = &mut *self;
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            if let Some(settling) = &mut this.settling {
                ready!(settling.as_mut().poll(cx));
                this.settling = None;
                this.done = true;
                return Poll::Ready(this.last.take().map(Ok));
            }
            // The body is taken only by the drop.
            let Some(body) = this.body.as_mut() else { return Poll::Ready(None) };
            match ready!(body.as_mut().poll_frame(cx)) {
                Some(Ok(frame)) => {
                    let end = this.body.as_ref().is_some_and(|body| body.is_end_stream());
                    let frame = match frame.into_data() {
                        Ok(data) => {
                            this.reader.feed(&data);
                            match &mut this.unasked {
                                Some(unasked) => {
                                    let mut out = unasked.filter(&data);
                                    if end {
                                        out.extend(unasked.finish());
                                    }
                                    if out.is_empty() && !end {
                                        continue;
                                    }
                                    Frame::data(Bytes::from(out))
                                }
                                None => Frame::data(data),
                            }
                        }
                        Err(frame) => frame,
                    };
                    match this.settle.take() {
                        // The last frame: settled first, then passed on.
                        Some(settle) if end => {
                            this.last = Some(frame);
                            this.reader.finish();
                            let whole = this.reader.whole();
                            this.settling = Some(settle.settling(&this.reader, whole));
                        }
                        settle => {
                            this.settle = settle;
                            return Poll::Ready(Some(Ok(frame)));
                        }
                    }
                }
                // The response was cut short: settled as such when the body is dropped.
                Some(Err(error)) => return Poll::Ready(Some(Err(error))),
                None => match this.settle.take() {
                    Some(settle) => {
                        // What the stream's filter still held (an event cut short) goes last.
                        let rest = this.unasked.as_mut().map(Unasked::finish).unwrap_or_default();
                        if !rest.is_empty() {
                            this.last = Some(Frame::data(Bytes::from(rest)));
                        }
                        // A stream that ended without its last event was cut short (see `Reader::whole`).
                        this.reader.finish();
                        let whole = this.reader.whole();
                        this.settling = Some(settle.settling(&this.reader, whole));
                    }
                    None => {
                        this.done = true;
                        return Poll::Ready(None);
                    }
                },
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.last.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        if self.unasked.is_some() {
            // Shorter than the upstream's by the chunk taken out.
            return SizeHint::default();
        }
        self.body.as_ref().map_or_else(SizeHint::default, |body| body.size_hint())
    }
}

impl<B, S: Store + 'static> Drop for Metered<B, S> {
    /// Dropped before its end was passed on (the client left, the upstream failed, or the server
    /// stopped polling once it had written the announced length): settled on a task. A JSON body
    /// (not streamed: the upstream has done the whole work by its head) is read on first, up to
    /// its bound and for at most [`MAX_READ_ON`], so that it is charged what it says; a stream
    /// is cut with its client, settled with what was read (whole only if the reader saw its last
    /// event). With no runtime, the reservations are dropped unsettled (refunded, see
    /// `Unsettled`).
    fn drop(&mut self) {
        let settling = match (self.settling.take(), self.settle.take(), self.body.take()) {
            (Some(settling), _, _) => settling,
            (None, Some(settle), Some(body)) if self.reader.reads_whole_body() => {
                let reader = std::mem::replace(&mut self.reader, Reader::new(None));
                (self.read_on)(body, reader, settle)
            }
            (None, Some(settle), _) => {
                self.reader.finish();
                let whole = self.reader.whole();
                settle.settling(&self.reader, whole)
            }
            (None, None, _) => return,
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(settling)),
            Err(_) => tracing::warn!("a metered response ended with no runtime to settle it on: refunded"),
        }
    }
}

impl<B, S: Store + 'static> std::fmt::Debug for Metered<B, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metered").field("reader", &self.reader).field("done", &self.done).finish_non_exhaustive()
    }
}
