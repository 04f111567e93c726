//! Review of issue 41's gRPC write coalescing (the first write after a flush yields once): a
//! single request's response still goes out with nothing else happening, beside a client that
//! never reads its responses (many streams, a one-byte window), after that client is dropped
//! mid-response, and with hundreds of streams on one connection.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::Server;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tollgate_rls::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use tollgate_rls::{RateLimitDescriptor, RateLimitRequest, RateLimitServiceClient};
use tollgate_server::Config;
use tonic::transport::Channel;

const CONFIG: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, requests_per_unit: 1000000 }\n";
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut frame = u32::try_from(payload.len()).unwrap().to_be_bytes()[1..].to_vec();
    frame.extend([kind, flags]);
    frame.extend(stream.to_be_bytes());
    frame.extend(payload);
    frame
}

/// One ShouldRateLimit call on `stream`, as raw HTTP/2 frames (HPACK literals, no Huffman).
fn raw_call(stream: u32) -> Vec<u8> {
    let mut headers = Vec::new();
    for (name, value) in [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"),
        (":authority", "x"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ] {
        headers.push(0);
        headers.push(u8::try_from(name.len()).unwrap());
        headers.extend(name.as_bytes());
        headers.push(u8::try_from(value.len()).unwrap());
        headers.extend(value.as_bytes());
    }
    // RateLimitRequest { domain: "d", descriptors: [{ entries: [{ key: "k", value: "v" }] }] }.
    let message = b"\x0a\x01d\x12\x08\x0a\x06\x0a\x01k\x12\x01v";
    let mut body = vec![0];
    body.extend(u32::try_from(message.len()).unwrap().to_be_bytes());
    body.extend(message);
    let mut call = frame(1, 4, stream, &headers);
    call.extend(frame(0, 1, stream, &body));
    call
}

fn request() -> RateLimitRequest {
    let descriptor = RateLimitDescriptor {
        entries: vec![Entry { key: "k".into(), value: "v".into() }],
        limit: None,
        hits_addend: None,
    };
    RateLimitRequest { domain: "d".into(), descriptors: vec![descriptor], hits_addend: 0 }
}

/// A call on a connection of its own, answered within 10 s (a timeout, not a measure).
async fn one_call(server: &Server, what: &str) {
    let channel = Channel::from_shared(format!("http://{}", server.grpc.unwrap())).unwrap().connect().await.unwrap();
    let mut client = RateLimitServiceClient::new(channel);
    let answered = tokio::time::timeout(Duration::from_secs(10), client.should_rate_limit(request())).await;
    assert!(matches!(answered, Ok(Ok(_))), "{what}: a single call was not answered: {answered:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_calls_are_answered_beside_a_client_that_never_reads_and_after_it_is_dropped() {
    let envoy = tollgate_envoy::Config::parse(CONFIG, "test.yaml").unwrap();
    let server = Server::start_with_grpc(Config { envoy: Arc::new(envoy), ..common::manual_config() }).await;
    one_call(&server, "alone").await;

    // A client with a one-byte window that sends thousands of calls and never reads.
    let mut hog = TcpStream::connect(server.grpc.unwrap()).await.unwrap();
    let mut opening = PREFACE.to_vec();
    opening.extend(frame(4, 0, 0, &[0, 4, 0, 0, 0, 1]));
    hog.write_all(&opening).await.unwrap();
    for stream in (1..4000u32).step_by(2) {
        match tokio::time::timeout(Duration::from_millis(500), hog.write_all(&raw_call(stream))).await {
            Ok(Ok(())) => {}
            // The server stopped reading it (flow control) or closed it: enough.
            _ => break,
        }
    }
    for i in 0..5 {
        one_call(&server, &format!("beside the client that never reads, #{i}")).await;
    }
    // Dropped mid-response: reset, its responses unwritten.
    hog.set_zero_linger().unwrap();
    drop(hog);

    // Hundreds of streams on one connection: every one answered.
    let channel = Channel::from_shared(format!("http://{}", server.grpc.unwrap())).unwrap().connect().await.unwrap();
    let calls = (0..300).map(|_| {
        let mut client = RateLimitServiceClient::new(channel.clone());
        async move { client.should_rate_limit(request()).await.map(|_| ()) }
    });
    let answered = tokio::time::timeout(Duration::from_secs(20), futures_util::future::join_all(calls)).await;
    let answered = answered.expect("300 concurrent calls on one connection were not all answered");
    assert!(answered.iter().all(Result::is_ok), "{:?}", answered.iter().find(|a| a.is_err()));
    for i in 0..3 {
        one_call(&server, &format!("after the drop, #{i}")).await;
    }
    server.stop().await;
}
