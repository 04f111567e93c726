//! The middleware in front of a service streaming an Anthropic-shaped response, on the memory
//! store: a stream read to its end is settled before its end reaches the client; a client that
//! drops the body mid-stream is charged the output tokens streamed so far.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, Response};
use bytes::Bytes;
use http_body::{Body as _, Frame};
use prometheus_client::registry::Registry;
use tollgate_core::{Algorithm, Limit, ManualClock};
use tollgate_engine::Engine;
use tollgate_rules::Rules;
use tollgate_store::{Check, MemoryStore, Store};
use tollgate_tower::{Options, PeerAddr, RateLimitLayer};
use tower_layer::Layer;
use tower_service::Service;

const T0: u64 = 1_700_000_000_000_000_000;

const OUTPUT: &str = "[[rules]]\nname = \"output\"\nlimit = \"1000/1h\"\nalgorithm = \"fixed-window\"\nkey = [\"global\"]\n\
     cost = \"response.usage.output_tokens\"\nestimate = 10\n";

/// A body whose pieces the test sends.
struct Channel(tokio::sync::mpsc::Receiver<Bytes>);

impl http_body::Body for Channel {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|piece| piece.map(|bytes| Ok(Frame::data(bytes))))
    }
}

/// A service answering its one request with the stream the test feeds.
#[derive(Clone)]
struct Streams(Arc<std::sync::Mutex<Option<tokio::sync::mpsc::Receiver<Bytes>>>>);

impl Service<Request<Body>> for Streams {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<Body>) -> Self::Future {
        let rx = self.0.lock().unwrap().take().expect("one request");
        let response = Response::builder().header("content-type", "text/event-stream").body(Body::new(Channel(rx)));
        std::future::ready(Ok(response.unwrap()))
    }
}

fn event(name: &str, data: &str) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
}

/// What is left of the output budget.
async fn left(store: &MemoryStore) -> u64 {
    let limit = Limit::per_hour(1000).algorithm(Algorithm::FixedWindow).build().unwrap();
    store.check_one(Check::new(b"", &limit, 0).scoped("output")).await.unwrap().remaining
}

/// The middleware over a service answering a stream the test feeds; the store, and the
/// response's body with the stream's sender.
async fn streaming() -> (Arc<MemoryStore>, Body, tokio::sync::mpsc::Sender<Bytes>) {
    let clock = Arc::new(ManualClock::new(T0));
    let store = Arc::new(MemoryStore::builder().clock(clock.clone()).build());
    let engine =
        Engine::builder(store.clone(), Rules::parse(OUTPUT, "t").unwrap()).clock(clock).build(&mut Registry::default());
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let service = Streams(Arc::new(std::sync::Mutex::new(Some(rx))));
    let mut service = RateLimitLayer::from_engine(Arc::new(engine), Options::default()).layer(service);
    let mut request = Request::post("/v1/messages").body(Body::empty()).unwrap();
    request.extensions_mut().insert(PeerAddr(SocketAddr::from(([192, 0, 2, 1], 4000))));
    let response = service.call(request).await.unwrap();
    (store, response.into_body(), tx)
}

async fn next(body: &mut Body) -> Option<Bytes> {
    let frame = std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await?;
    Some(frame.unwrap().into_data().unwrap())
}

const START: &str = r#"{"type":"message_start","message":{"usage":{"input_tokens":25,"output_tokens":1}}}"#;
const DELTA: &str = r#"{"type":"message_delta","delta":{"stop_reason":null},"usage":{"output_tokens":120}}"#;

#[tokio::test]
async fn a_stream_read_to_its_end_is_settled_before_its_end_is_passed_on() {
    let (store, mut body, tx) = streaming().await;
    assert_eq!(left(&store).await, 990, "the estimate reserved");
    for piece in [
        event("message_start", START),
        event("message_delta", DELTA),
        event("message_stop", r#"{"type":"message_stop"}"#),
    ] {
        tx.send(piece.clone()).await.unwrap();
        assert_eq!(next(&mut body).await, Some(piece), "passed on unchanged");
    }
    drop(tx);
    assert_eq!(next(&mut body).await, None);
    assert_eq!(left(&store).await, 880, "120 output tokens: 110 past the estimate charged");
}

#[tokio::test]
async fn a_client_dropping_the_body_mid_stream_is_charged_what_was_streamed() {
    let (store, mut body, tx) = streaming().await;
    for piece in [event("message_start", START), event("message_delta", DELTA)] {
        tx.send(piece).await.unwrap();
        next(&mut body).await.unwrap();
    }
    drop(body);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while left(&store).await != 880 {
        assert!(tokio::time::Instant::now() < deadline, "left {}", left(&store).await);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(tx);
}
