//! The gRPC listener's bounds, from the wire: the concurrent-stream limit advertised in the
//! server's HTTP/2 SETTINGS, the connection cap, the preface deadline, the idle bound and the
//! message-size limit, the health service's too (before: tonic's defaults, no stream limit
//! advertised, no cap, no deadline, no idle bound, 4 MB messages).

mod common;

use std::time::Duration;

use common::Server;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tollgate_rls::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use tollgate_rls::{RateLimitDescriptor, RateLimitRequest, RateLimitServiceClient};
use tollgate_server::{Config, GrpcBounds};
use tonic::transport::Channel;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

async fn start(bounds: GrpcBounds) -> Server {
    Server::start_with_grpc(Config { grpc: bounds, ..common::manual_config() }).await
}

/// Opens a connection and sends the preface and an empty SETTINGS frame (a connection over the
/// cap may be closed before they are written).
async fn connect(server: &Server) -> TcpStream {
    let mut stream = TcpStream::connect(server.grpc.unwrap()).await.unwrap();
    let _ = stream.write_all(PREFACE).await;
    let _ = stream.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await;
    stream
}

/// The settings of the server's first SETTINGS frame, or `None` if the connection closes first.
async fn server_settings(stream: &mut TcpStream) -> Option<Vec<(u16, u32)>> {
    let mut header = [0u8; 9];
    tokio::time::timeout(Duration::from_secs(10), stream.read_exact(&mut header)).await.ok()?.ok()?;
    assert_eq!(header[3], 4, "the server speaks first with SETTINGS");
    let length = usize::from(header[1]) << 8 | usize::from(header[2]);
    let mut payload = vec![0u8; length];
    stream.read_exact(&mut payload).await.ok()?;
    Some(
        payload
            .chunks(6)
            .map(|s| (u16::from_be_bytes([s[0], s[1]]), u32::from_be_bytes([s[2], s[3], s[4], s[5]])))
            .collect(),
    )
}

/// Whether the server closes `stream` (reads end) within a few seconds.
async fn closed(stream: &mut TcpStream) -> bool {
    let mut sink = [0u8; 1024];
    loop {
        match tokio::time::timeout(Duration::from_secs(5), stream.read(&mut sink)).await {
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
            Err(_) => return false,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_limit_is_advertised_and_connections_are_capped() {
    let server = start(GrpcBounds { max_connections: 2, max_concurrent_streams: 64, ..GrpcBounds::default() }).await;
    let mut first = connect(&server).await;
    let settings = server_settings(&mut first).await.expect("the first connection is served");
    assert!(settings.contains(&(3, 64)), "SETTINGS_MAX_CONCURRENT_STREAMS = 64: {settings:?}");
    assert!(settings.iter().any(|&(id, value)| id == 6 && value <= 16 << 10), "a header list limit: {settings:?}");
    let mut second = connect(&server).await;
    assert!(server_settings(&mut second).await.is_some(), "the second too");
    let mut third = connect(&server).await;
    assert!(closed(&mut third).await, "the third is closed: two at most");
    drop((first, second));
    // The slots are given back when connections close.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut again = connect(&server).await;
    assert!(server_settings(&mut again).await.is_some(), "served again");
    // A connection still open at shutdown holds it for the grace at most (before: until its
    // keepalive gave up, 40 s).
    server.stop().await;
    drop(again);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_without_a_preface_is_closed() {
    let server = start(GrpcBounds { header_read_timeout: Duration::from_millis(300), ..GrpcBounds::default() }).await;
    let mut silent = TcpStream::connect(server.grpc.unwrap()).await.unwrap();
    assert!(closed(&mut silent).await, "closed after the preface deadline");
    let mut half = TcpStream::connect(server.grpc.unwrap()).await.unwrap();
    half.write_all(&PREFACE[..10]).await.unwrap();
    assert!(closed(&mut half).await, "a partial preface too");
    // A connection that sent its preface is not bound by the deadline.
    let mut served = connect(&server).await;
    assert!(server_settings(&mut served).await.is_some());
    tokio::time::sleep(Duration::from_millis(600)).await;
    served.write_all(&[0, 0, 8, 6, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]).await.unwrap();
    let mut header = [0u8; 9];
    loop {
        tokio::time::timeout(Duration::from_secs(5), served.read_exact(&mut header)).await.unwrap().unwrap();
        let length = usize::from(header[1]) << 8 | usize::from(header[2]);
        let mut payload = vec![0u8; length];
        served.read_exact(&mut payload).await.unwrap();
        if header[3] == 6 && header[4] == 1 {
            break; // the PING's acknowledgement: still served
        }
    }
    drop(served);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_over_the_limit_is_refused() {
    let server = start(GrpcBounds { max_message_bytes: 1024, ..GrpcBounds::default() }).await;
    let url = format!("http://{}", server.grpc.unwrap());
    let channel = Channel::from_shared(url).unwrap().connect().await.unwrap();
    let mut client = RateLimitServiceClient::new(channel);
    let descriptor = |value: String| RateLimitDescriptor {
        entries: vec![Entry { key: "remote_address".into(), value }],
        limit: None,
        hits_addend: None,
    };
    let request =
        |value: String| RateLimitRequest { domain: "d".into(), descriptors: vec![descriptor(value)], hits_addend: 0 };
    let status = client.should_rate_limit(request("x".repeat(4096))).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status}");
    assert!(client.should_rate_limit(request("x".into())).await.is_ok(), "the connection serves on");
    server.stop().await;
}

/// Reads the server's frames until it closes `stream`, answering its PINGs and SETTINGS as a
/// live client does: the PINGs answered, or `None` if it is still open after `within`.
async fn answer_pings_until_closed(stream: &mut TcpStream, within: Duration) -> Option<usize> {
    let deadline = tokio::time::Instant::now() + within;
    let mut answered = 0;
    loop {
        let mut header = [0u8; 9];
        match tokio::time::timeout_at(deadline, stream.read_exact(&mut header)).await {
            Err(_) => return None,
            Ok(Err(_)) => return Some(answered),
            Ok(Ok(_)) => {}
        }
        let length = usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
        let mut payload = vec![0u8; length];
        match tokio::time::timeout_at(deadline, stream.read_exact(&mut payload)).await {
            Err(_) => return None,
            Ok(Err(_)) => return Some(answered),
            Ok(Ok(_)) => {}
        }
        let reply = match (header[3], header[4] & 1) {
            // A PING, acknowledged with its payload.
            (6, 0) => [&[0, 0, 8, 6, 1, 0, 0, 0, 0][..], &payload].concat(),
            // SETTINGS, acknowledged.
            (4, 0) => vec![0, 0, 0, 4, 1, 0, 0, 0, 0],
            _ => continue,
        };
        if stream.write_all(&reply).await.is_err() {
            return Some(answered);
        }
        answered += usize::from(header[3] == 6);
    }
}

/// Before: a connection past its preface that answered the keepalive PINGs and sent no request
/// held one of the connection slots for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_is_closed_though_it_answers_pings() {
    let server = start(GrpcBounds {
        keepalive: Duration::from_millis(100),
        idle_timeout: Some(Duration::from_millis(1500)),
        ..GrpcBounds::default()
    })
    .await;
    let mut idle = connect(&server).await;
    let answered = answer_pings_until_closed(&mut idle, Duration::from_secs(10)).await;
    let answered = answered.expect("still open after 10 s, its PINGs answered: the idle bound is 1.5 s");
    assert!(answered > 0, "closed before the server pinged it (every 100 ms): the PINGs were not put to the test");
    server.stop().await;
}

/// Before: a client that sent PINGs and read nothing held its connection for ever, whatever the
/// keepalive and idle bounds: the server's writes (the PINGs' acknowledgements) blocked, so it
/// read no more (the idle bound is checked as it reads), and its keepalive PING, never written,
/// timed out into a GOAWAY that could not be written either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_reads_nothing_is_closed() {
    let server = start(GrpcBounds {
        keepalive: Duration::from_millis(100),
        keepalive_timeout: Duration::from_millis(300),
        idle_timeout: Some(Duration::from_millis(300)),
        ..GrpcBounds::default()
    })
    .await;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let stream = socket.connect(server.grpc.unwrap()).await.unwrap();
    let ping = [0, 0, 8, 6, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
    let frames = [PREFACE, &[0, 0, 0, 4, 0, 0, 0, 0, 0]].concat();
    let pings = ping.repeat(4096);
    // PINGs written whole (a frame cut short would be a protocol error, closing the connection
    // for another reason), until a write fails: the server closed the connection.
    let (mut unsent, mut blocked) = (&frames[..], false);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let closed = loop {
        if unsent.is_empty() {
            unsent = &pings;
        }
        match tokio::time::timeout_at(deadline, stream.writable()).await {
            Err(_) => break false,
            Ok(ready) => ready.unwrap(),
        }
        match stream.try_write(unsent) {
            Ok(written) => unsent = &unsent[written..],
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => blocked = true,
            Err(_) => break true,
        }
    };
    assert!(blocked, "the server read everything: its writes never blocked");
    assert!(closed, "still open after 20 s, reading nothing: the keepalive and idle bounds are 300 ms");
    server.stop().await;
}

/// A request under way is not idleness, however long it lasts: a `Watch` of the health service
/// (a stream that stays open) keeps its connection past the idle bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_with_a_stream_open_is_not_idle() {
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};
    let server = start(GrpcBounds { idle_timeout: Some(Duration::from_millis(300)), ..GrpcBounds::default() }).await;
    let channel = Channel::from_shared(format!("http://{}", server.grpc.unwrap())).unwrap().connect().await.unwrap();
    let mut health = HealthClient::new(channel);
    let mut watch = health.watch(HealthCheckRequest { service: String::new() }).await.unwrap().into_inner();
    let first = watch.message().await.unwrap().expect("the current status");
    assert_eq!(first.status(), ServingStatus::Serving);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // A closed connection would end the stream at once, with an error.
    let next = tokio::time::timeout(Duration::from_millis(300), watch.message()).await;
    assert!(next.is_err(), "the stream ended past the idle bound: {next:?}");
    server.stop().await;
}

/// Before: the health service had tonic's default limit, 4 MiB, whatever --grpc-max-message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_health_service_has_the_same_message_limit() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;
    let server = start(GrpcBounds { max_message_bytes: 1024, ..GrpcBounds::default() }).await;
    let channel = Channel::from_shared(format!("http://{}", server.grpc.unwrap())).unwrap().connect().await.unwrap();
    let mut health = HealthClient::new(channel);
    let status = health.check(HealthCheckRequest { service: "x".repeat(4096) }).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status}");
    let served = health.check(HealthCheckRequest { service: String::new() }).await;
    assert!(served.is_ok(), "the connection serves on: {served:?}");
    server.stop().await;
}
