//! Ways around a cost read from the response (LLM tokens), end to end through `tollgate proxy`:
//! each test makes the upstream say what a request cost (`usage.total_tokens`) in a way a
//! client can bring about, and checks that the key's budget reads it (or, for a response that
//! used nothing, that the estimate is given back).
//!
//! The budget is read as the next request sees it: the `RateLimit` field of a request to
//! `/free` (which the upstream answers with a usage of 0) reports `5000 - spent - 100`, its own
//! estimate of 100 reserved on top (then refunded).

mod common;

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use axum::routing::post;
use common::proxy::{Proxy, curl};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tollgate_rules::Rules;
use tollgate_server::proxy::ProxyConfig;
use tollgate_tower::Options;

const RULES: &str = "[[rules]]\nname = \"tokens\"\nlimit = \"5000/1h\"\nalgorithm = \"fixed-window\"\n\
     key = [\"header:x-api-key\"]\ncost = \"response.usage.total_tokens\"\nestimate = 100\n";

/// A chat completion (OpenAI's shape, not streamed) whose usage says `total` tokens, its one
/// message `content` long.
fn completion(total: u64, content: &str) -> String {
    serde_json::json!({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4o",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": total, "completion_tokens": 0, "total_tokens": total},
    })
    .to_string()
}

fn json(status: StatusCode, body: impl Into<Body>) -> Response {
    Response::builder().status(status).header(header::CONTENT_TYPE, "application/json").body(body.into()).unwrap()
}

/// The CRC-32 of gzip (IEEE 802.3, reflected).
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

/// `bytes` as a gzip member of stored (uncompressed) deflate blocks: what any gzip decoder
/// reads back as `bytes`.
fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut out = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];
    let blocks: Vec<&[u8]> = bytes.chunks(0xffff).collect();
    for (i, block) in blocks.iter().enumerate() {
        out.push(u8::from(i + 1 == blocks.len()));
        let len = u16::try_from(block.len()).unwrap();
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&(!len).to_le_bytes());
        out.extend_from_slice(block);
    }
    out.extend_from_slice(&crc32(bytes).to_le_bytes());
    out.extend_from_slice(&u32::try_from(bytes.len()).unwrap().to_le_bytes());
    out
}

/// The fake upstream: `/free` costs nothing; `/gzip` costs 900 and is gzip-encoded when the
/// request accepts it (as OpenAI's API and most servers behind a compressing front do); `/slow`
/// costs 900, answered after a second; `/big` costs 900 with 2 MiB of content (`"n": 128` or
/// `logprobs` make such bodies); `/late-body` costs 900, its head sent at once and its body a
/// second later; `/cut-stream` is an Anthropic-shaped stream ended by an `error` event after
/// `message_start` (which says `total_tokens: 1`); `/stream/chat/completions` is an OpenAI chat
/// completions stream that costs 900, with its usage chunk only when the request asks for it; `/long-stop` is an Anthropic stream
/// whose `message_delta` (900 tokens) echoes a 70 KiB stop sequence; `/huge` costs 5000; `/overloaded` is a 503 that used nothing.
async fn upstream() -> String {
    let app = Router::new()
        .route("/free", post(|| async { json(StatusCode::OK, completion(0, "")) }))
        .route(
            "/gzip",
            post(|headers: HeaderMap| async move {
                let body = completion(900, "Hello world");
                let accepts = headers.get(header::ACCEPT_ENCODING).and_then(|v| v.to_str().ok()).unwrap_or("");
                if !accepts.contains("gzip") {
                    return json(StatusCode::OK, body);
                }
                let mut response = json(StatusCode::OK, gzip(body.as_bytes()));
                response.headers_mut().insert(header::CONTENT_ENCODING, "gzip".parse().unwrap());
                response
            }),
        )
        .route(
            "/slow",
            post(|| async {
                tokio::time::sleep(Duration::from_secs(1)).await;
                json(StatusCode::OK, completion(900, "Hello world"))
            }),
        )
        .route("/big", post(|| async { json(StatusCode::OK, completion(900, &"word ".repeat(400_000))) }))
        .route(
            "/late-body",
            post(|| async {
                // The head at once, the completion a second later (a server that flushes its head first).
                let body = futures_util::stream::once(async {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    Ok::<_, std::convert::Infallible>(bytes::Bytes::from(completion(900, "Hello world")))
                });
                json(StatusCode::OK, Body::from_stream(body))
            }),
        )
        .route(
            "/cut-stream",
            post(|| async {
                let start = r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"m","usage":{"input_tokens":0,"output_tokens":1,"total_tokens":1}}}"#;
                let delta = r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}"#;
                let error = r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
                let events = format!(
                    "event: message_start\ndata: {start}\n\nevent: content_block_delta\ndata: {delta}\n\n\
                     event: error\ndata: {error}\n\n"
                );
                Response::builder().header(header::CONTENT_TYPE, "text/event-stream").body(Body::from(events)).unwrap()
            }),
        )
        .route(
            "/stream/chat/completions",
            post(|body: bytes::Bytes| async move {
                // OpenAI's stream: the usage in a last chunk only when the request asks for it.
                let request: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                let chunk = r#"{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hi"}}]}"#;
                let mut events = format!("data: {chunk}\n\n");
                if request["stream_options"]["include_usage"] == true {
                    let usage = r#"{"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":900,"completion_tokens":0,"total_tokens":900}}"#;
                    events.push_str(&format!("data: {usage}\n\n"));
                }
                events.push_str("data: [DONE]\n\n");
                Response::builder().header(header::CONTENT_TYPE, "text/event-stream").body(Body::from(events)).unwrap()
            }),
        )
        .route(
            "/long-stop",
            post(|| async {
                // The stop sequence is the client's (`stop_sequences`), echoed in `message_delta`.
                let start = r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"m","usage":{"input_tokens":0,"output_tokens":1,"total_tokens":1}}}"#;
                let stop = "x".repeat(70 << 10);
                let delta = format!(
                    r#"{{"type":"message_delta","delta":{{"stop_reason":"stop_sequence","stop_sequence":"{stop}"}},"usage":{{"output_tokens":900,"total_tokens":900}}}}"#
                );
                let events = format!(
                    "event: message_start\ndata: {start}\n\nevent: message_delta\ndata: {delta}\n\n\
                     event: message_stop\ndata: {{\"type\":\"message_stop\"}}\n\n"
                );
                Response::builder().header(header::CONTENT_TYPE, "text/event-stream").body(Body::from(events)).unwrap()
            }),
        )
        .route("/huge", post(|| async { json(StatusCode::OK, completion(5000, "Hello world")) }))
        .route(
            "/overloaded",
            post(|| async {
                let error = r#"{"error":{"message":"The server is overloaded","type":"server_error","code":null}}"#;
                json(StatusCode::SERVICE_UNAVAILABLE, error)
            }),
        );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{address}")
}

async fn start(upstream: &str) -> Proxy {
    start_with(upstream, RULES, common::manual_config()).await
}

async fn start_with(upstream: &str, rules: &str, config: tollgate_server::Config) -> Proxy {
    let proxy = ProxyConfig {
        upstream: upstream.to_string(),
        rules: Rules::parse(rules, "test").unwrap(),
        rules_file: None,
        options: Options { headers_on_allowed: true, ..Options::default() },
        upstream_timeout: Duration::from_secs(10),
        tls: None,
        limits: Default::default(),
    };
    Proxy::start(config, proxy).await
}

/// curl `POST path` for `key` with the body `{}` and `extra` arguments: the status and the
/// `RateLimit` field without its reset (`"tokens";r=4800`).
async fn call(proxy: &Proxy, path: &str, key: &str, extra: &[&str]) -> (u16, String) {
    call_with(proxy, path, key, "{}", extra).await
}

/// [`call`] with the JSON body `body`.
async fn call_with(proxy: &Proxy, path: &str, key: &str, body: &str, extra: &[&str]) -> (u16, String) {
    let mut args: Vec<String> =
        vec!["-X".into(), "POST".into(), proxy.url(path), "-H".into(), format!("x-api-key: {key}")];
    args.extend(["-H".into(), "content-type: application/json".into(), "--data".into(), body.into()]);
    args.extend(extra.iter().map(|a| (*a).to_string()));
    let (status, text) = curl(args).await;
    let head = text.split("\r\n\r\n").next().unwrap_or("");
    let field = head.lines().find_map(|l| l.strip_prefix("ratelimit: ")).unwrap_or("");
    (status, field.split(";t=").next().unwrap_or("").to_string())
}

/// What is left of `key`'s 5000 as the next request sees it (its own estimate of 100 reserved).
async fn left(proxy: &Proxy, key: &str) -> String {
    call(proxy, "/free", key, &[]).await.1
}

/// Reads `key`'s budget until it is `wanted`, for at most 5 s (a settlement on a task of its
/// own); the last reading otherwise.
async fn eventually_left(proxy: &Proxy, key: &str, wanted: &str) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let seen = left(proxy, key).await;
        if seen == wanted || tokio::time::Instant::now() > deadline {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A client that accepts gzip gets the upstream's gzip-encoded completion: its usage is still
/// what the request cost (900 tokens, not the estimate of 100).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gzip_encoded_completion_is_charged_what_its_usage_says() {
    let up = upstream().await;
    let proxy = start(&up).await;
    let (status, _) = call(&proxy, "/gzip", "plain", &[]).await;
    assert_eq!(status, 200);
    assert_eq!(left(&proxy, "plain").await, "\"tokens\";r=4000", "an identity body: 5000 - 900 - 100 reserved");
    let (status, _) = call(&proxy, "/gzip", "gzip", &["-H", "accept-encoding: gzip"]).await;
    assert_eq!(status, 200);
    let seen = left(&proxy, "gzip").await;
    assert_eq!(
        seen, "\"tokens\";r=4000",
        "a gzip-encoded completion (Accept-Encoding: gzip, the client's choice) read {seen}: charged its estimate of \
         100, not the 900 tokens its usage says"
    );
    proxy.stop().await;
}

/// A client that leaves before the response's head (a non-streamed completion takes a while):
/// the proxy's call goes on, the upstream does the whole work and says it cost 900 tokens; the
/// request is charged those, not its estimate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_before_the_head_is_charged_what_the_response_says() {
    let up = upstream().await;
    let proxy = start(&up).await;
    let mut client = TcpStream::connect(proxy.at).await.unwrap();
    let request = "POST /slow HTTP/1.1\r\nhost: localhost\r\nx-api-key: gone\r\ncontent-type: application/json\r\n\
                   content-length: 2\r\n\r\n{}";
    client.write_all(request.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(client);
    // The upstream answers a second after the request; its settlement follows.
    let seen = eventually_left(&proxy, "gone", "\"tokens\";r=4000").await;
    assert_eq!(
        seen, "\"tokens\";r=4000",
        "a client that left before the head of a completion whose usage says 900 read {seen}: charged its estimate of \
         100 (5000 - 100 - 100 reserved)"
    );
    proxy.stop().await;
}

/// A completion over 1 MiB (the client asked for many choices, or logprobs): its usage, at the
/// end of the body as OpenAI writes it, still says what the request cost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_over_one_mebibyte_is_charged_what_its_usage_says() {
    let up = upstream().await;
    let proxy = start(&up).await;
    let (status, _) = call(&proxy, "/big", "big", &[]).await;
    assert_eq!(status, 200);
    let seen = left(&proxy, "big").await;
    assert_eq!(
        seen, "\"tokens\";r=4000",
        "a 2 MiB completion whose usage says 900 read {seen}: charged its estimate of 100, its usage unread"
    );
    proxy.stop().await;
}

/// An upstream that failed (503, overloaded) used no tokens and says no usage: the estimate is
/// given back, so that an outage of the upstream does not spend its clients' budgets (with
/// `estimate_default = 4096` under `100000/1m`, 25 retried errors lock a key out for a minute).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_error_that_says_no_usage_gives_the_estimate_back() {
    let up = upstream().await;
    let proxy = start(&up).await;
    for _ in 0..3 {
        let (status, _) = call(&proxy, "/overloaded", "outage", &[]).await;
        assert_eq!(status, 503);
    }
    let seen = left(&proxy, "outage").await;
    assert_eq!(
        seen, "\"tokens\";r=4900",
        "after three 503s that used nothing the key read {seen}: each kept its estimate of 100"
    );
    proxy.stop().await;
}

/// A client that reads the head of a non-streamed completion and leaves before its body (the
/// upstream did the whole work by then): charged the 900 tokens the body says, not the estimate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_after_the_head_of_a_completion_is_charged_what_its_body_says() {
    let up = upstream().await;
    let proxy = start(&up).await;
    let mut client = TcpStream::connect(proxy.at).await.unwrap();
    let request = "POST /late-body HTTP/1.1\r\nhost: localhost\r\nx-api-key: head-only\r\n\
                   content-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
    client.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut buffer = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(10), client.read(&mut buffer)).await.unwrap().unwrap();
        assert!(n > 0, "closed before the head: {}", String::from_utf8_lossy(&head));
        head.extend_from_slice(&buffer[..n]);
    }
    drop(client);
    let seen = eventually_left(&proxy, "head-only", "\"tokens\";r=4000").await;
    assert_eq!(
        seen, "\"tokens\";r=4000",
        "a client that left after the head of a completion whose usage says 900 read {seen}: charged its estimate of \
         100"
    );
    proxy.stop().await;
}

/// An Anthropic stream the upstream ends before its last event (an `error` event, as Anthropic
/// sends `overloaded_error` mid-stream, then the end): cut short, so each field settles at the
/// larger of what it said and the estimate (as for a client that leaves), not at the
/// `output_tokens: 1` of `message_start`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_the_upstream_cuts_short_keeps_at_least_the_estimate() {
    let up = upstream().await;
    let proxy = start(&up).await;
    let (status, _) = call(&proxy, "/cut-stream", "cut", &[]).await;
    assert_eq!(status, 200);
    let seen = left(&proxy, "cut").await;
    assert_eq!(
        seen, "\"tokens\";r=4800",
        "a stream ended by an error event after message_start (total_tokens 1 said so far) read {seen}: settled as whole \
         at 1, its estimate of 100 refunded"
    );
    proxy.stop().await;
}

/// An OpenAI stream whose request does not ask for its usage (`stream_options.include_usage`,
/// off by default): the upstream used 900 tokens (a long prompt) all the same; charged those,
/// not the estimate (with `examples/rules/llm-tokens.toml`, every streamed request would
/// otherwise pay 1000 input tokens whatever its prompt).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_does_not_ask_for_its_usage_is_charged_what_it_used() {
    let up = upstream().await;
    let proxy = start(&up).await;
    let asked = r#"{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true}}"#;
    let (status, _) = call_with(&proxy, "/stream/chat/completions", "asked", asked, &[]).await;
    assert_eq!(status, 200);
    assert_eq!(left(&proxy, "asked").await, "\"tokens\";r=4000", "the usage asked for: 5000 - 900 - 100 reserved");
    let (status, _) =
        call_with(&proxy, "/stream/chat/completions", "silent", r#"{"model":"gpt-4o","stream":true}"#, &[]).await;
    assert_eq!(status, 200);
    let seen = left(&proxy, "silent").await;
    assert_eq!(
        seen, "\"tokens\";r=4000",
        "a stream that did not ask for its usage (900 tokens used) read {seen}: charged its estimate of 100"
    );
    proxy.stop().await;
}

/// The usage chunk the proxy asked for on behalf of a client that did not is taken out of the
/// stream that client gets (it asked for none: a client that reads `choices[0]` of every chunk
/// would fail on it); a client that asked for it gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_usage_chunk_the_proxy_asked_for_is_not_passed_on() {
    let up = upstream().await;
    let proxy = start(&up).await;
    let stream = |key: &str, body: &str| {
        let args = [
            "-X",
            "POST",
            &proxy.url("/stream/chat/completions"),
            "-H",
            &format!("x-api-key: {key}"),
            "-H",
            "content-type: application/json",
            "--data",
            body,
        ];
        curl(args.iter().map(|a| (*a).to_string()).collect())
    };
    let (status, silent) = stream("silent", r#"{"model":"gpt-4o","stream":true}"#).await;
    assert_eq!(status, 200);
    let events = silent.split("\r\n\r\n").nth(1).unwrap_or("");
    assert_eq!(
        events,
        "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n\
         data: [DONE]\n\n",
        "the stream a client that did not ask for its usage gets"
    );
    let asked = r#"{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true}}"#;
    let (status, text) = stream("asked", asked).await;
    assert_eq!(status, 200);
    assert!(text.contains("\"choices\":[],\"usage\""), "a client that asked for its usage gets it: {text}");
    proxy.stop().await;
}

/// `max_tokens` read from a request body sent without a `Content-Type`: FastAPI (vLLM, SGLang,
/// LiteLLM) parses such a body as JSON and acts on its `max_tokens`, so its estimate is that,
/// not `estimate_default` (what users see is what the upstream acts on: a client leaving
/// mid-stream, or asking more than the key has left, pays by `max_tokens`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_without_a_content_type_gives_its_max_tokens_as_the_estimate() {
    let up = upstream().await;
    let rules = RULES.replace("estimate = 100", "estimate = \"request.json.max_tokens\"\nestimate_default = 2000");
    let proxy = start_with(&up, &rules, common::manual_config()).await;
    let body = r#"{"model":"gpt-4o","max_tokens":3000,"messages":[]}"#;
    let typed = call_with(&proxy, "/free", "typed", body, &[]).await;
    assert_eq!(typed, (200, "\"tokens\";r=2000".to_string()), "3000 reserved from max_tokens");
    // curl sends no Content-Type when told an empty one.
    let args = ["-X", "POST", &proxy.url("/free"), "-H", "x-api-key: untyped", "-H", "content-type:", "--data", body];
    let (status, text) = curl(args.iter().map(|a| (*a).to_string()).collect()).await;
    let field = text.lines().find_map(|l| l.strip_prefix("ratelimit: ")).unwrap_or("");
    let untyped = (status, field.split(";t=").next().unwrap_or("").to_string());
    assert_eq!(
        untyped,
        (200, "\"tokens\";r=2000".to_string()),
        "the same body without a Content-Type (read as JSON by FastAPI upstreams) reserved estimate_default 2000, \
         not its max_tokens 3000"
    );
    proxy.stop().await;
}

/// An Anthropic stream whose `message_delta` is over the 64 KiB an event is read to (it echoes
/// the client's own `stop_sequences`): its count unread, the request is not settled at the
/// `output_tokens: 1` of `message_start` as if that were final, but at least at its estimate
/// (better: at the 900 the delta says).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_usage_event_over_the_bound_does_not_settle_below_the_estimate() {
    let up = upstream().await;
    let proxy = start(&up).await;
    let (status, _) = call(&proxy, "/long-stop", "long-stop", &[]).await;
    assert_eq!(status, 200);
    let seen = left(&proxy, "long-stop").await;
    assert!(
        seen == "\"tokens\";r=4000" || seen == "\"tokens\";r=4800",
        "a stream whose 900-token message_delta (70 KiB, a client-chosen stop sequence) went unread read {seen}: \
         settled at message_start's 1, its estimate of 100 refunded"
    );
    proxy.stop().await;
}

/// A request whose response says it cost 5000 tokens under `1000/1m` puts its key 4000 tokens
/// in debt: "its next requests pay for it" (docs/rules.md), so the key has nothing for the next
/// four minutes, on the window algorithms the docs recommend for token budgets as on the bucket
/// family. (Were the debt forgotten when the window rolls, a key would use any number of tokens a
/// window: as many requests as its budget has estimates, each as large as it likes.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debt_past_the_limit_outlives_the_window() {
    let up = upstream().await;
    let mut forgiven = Vec::new();
    for algorithm in ["fixed-window", "sliding-window", "gcra"] {
        let rules = RULES.replace("5000/1h", "1000/1m").replace("fixed-window", algorithm);
        let clock = std::sync::Arc::new(tollgate_core::ManualClock::new(common::T0));
        let config = tollgate_server::Config { clock: clock.clone(), ..common::manual_config() };
        let proxy = start_with(&up, &rules, config).await;
        let (status, _) = call(&proxy, "/huge", "debtor", &[]).await;
        assert_eq!(status, 200, "{algorithm}");
        let mut admitted = Vec::new();
        for minute in 1..=3 {
            clock.advance(Duration::from_secs(61));
            let (status, field) = call(&proxy, "/free", "debtor", &[]).await;
            if status == 200 {
                admitted.push(format!("minute {minute}: {field}"));
            }
        }
        if !admitted.is_empty() {
            forgiven.push(format!("{algorithm}: {}", admitted.join(", ")));
        }
        proxy.stop().await;
    }
    assert!(
        forgiven.is_empty(),
        "5000 tokens charged under 1000/1m, yet admitted again within the 4 minutes the debt lasts: {}",
        forgiven.join("; ")
    );
}
