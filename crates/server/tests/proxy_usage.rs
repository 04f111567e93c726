//! LLM tokens counted from the response, end to end through `tollgate proxy` in front of a fake
//! OpenAI-compatible / Anthropic upstream that streams real-shaped server-sent events: each
//! request reserves its estimate, and the key's remaining budget then reads the tokens the
//! response said (streamed or not), input and output each from its own field; a client that
//! leaves mid-stream is charged what was streamed.

mod common;

use std::convert::Infallible;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, header};
use axum::response::Response;
use axum::routing::post;
use bytes::Bytes;
use common::proxy::{Proxy, curl};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tollgate_rules::Rules;
use tollgate_server::proxy::ProxyConfig;
use tollgate_server::{Config, StoreConfig};
use tollgate_store::testkit::redis_server::RedisServer;
use tollgate_store::{Algorithm, Check, Limit, RedisOptions, RedisStore, Store};
use tollgate_tower::Options;

/// The two counts the fake upstream says a request cost (`x-fake-usage: 19,10`), default 0.
fn counts(headers: &HeaderMap) -> (u64, u64) {
    let text = headers.get("x-fake-usage").and_then(|v| v.to_str().ok()).unwrap_or("0,0");
    let (a, b) = text.split_once(',').unwrap();
    (a.parse().unwrap(), b.parse().unwrap())
}

/// A body sent event by event, a few milliseconds apart (a real stream, not one write); the
/// sender stops when the proxy drops the connection.
fn streamed(events: Vec<String>, then_pings: bool) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(1);
    tokio::spawn(async move {
        for event in events {
            if tx.send(Bytes::from(event)).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // A stream that goes on (Anthropic's keep-alive pings) until the client leaves.
        if then_pings {
            while tx.send(Bytes::from_static(b"event: ping\ndata: {\"type\": \"ping\"}\n\n")).await.is_ok() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|bytes| (Ok::<_, Infallible>(bytes), rx))
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream))
        .unwrap()
}

/// `POST /v1/chat/completions`, OpenAI's shape: a JSON completion, or (`"stream": true`) chunks
/// with the usage in the last one when `stream_options.include_usage` asks for it.
async fn openai(headers: HeaderMap, body: Bytes) -> Response {
    let request: Value = serde_json::from_slice(&body).unwrap();
    let (prompt, completion) = counts(&headers);
    let usage = serde_json::json!({
        "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": 0}, "completion_tokens_details": {"reasoning_tokens": 0}
    });
    if request["stream"] != true {
        let completion = serde_json::json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": request["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello world"}, "finish_reason": "stop"}],
            "usage": usage,
        });
        return Response::builder()
            .header(header::CONTENT_TYPE, "application/json")
            .header("x-tokens-used", usage["total_tokens"].to_string())
            .body(Body::from(completion.to_string()))
            .unwrap();
    }
    let chunk = |delta: Value, finish: Value| {
        let chunk = serde_json::json!({
            "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": request["model"],
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], "usage": null,
        });
        format!("data: {chunk}\n\n")
    };
    let mut events = vec![
        chunk(serde_json::json!({"role": "assistant", "content": ""}), Value::Null),
        chunk(serde_json::json!({"content": "Hello"}), Value::Null),
        chunk(serde_json::json!({"content": " world"}), Value::Null),
        chunk(serde_json::json!({}), "stop".into()),
    ];
    if request["stream_options"]["include_usage"] == true {
        let last = serde_json::json!({
            "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": request["model"],
            "choices": [], "usage": usage,
        });
        events.push(format!("data: {last}\n\n"));
    }
    events.push("data: [DONE]\n\n".into());
    streamed(events, false)
}

/// `POST /v1/messages`, Anthropic's shape, streamed: `message_start` with the input tokens,
/// content, `message_delta` with the cumulative output tokens, `message_stop`; with
/// `x-fake-hang`, pings after the `message_delta` instead of the stop (the client leaves).
async fn anthropic(headers: HeaderMap, body: Bytes) -> Response {
    let request: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(request["stream"], true, "the tests stream");
    // As Anthropic's API does, a field it does not know is refused.
    if let Some(extra) = request.as_object().unwrap().keys().find(|k| !ANTHROPIC_FIELDS.contains(&k.as_str())) {
        return refused(&format!("{extra}: Extra inputs are not permitted"));
    }
    let (input, output) = counts(&headers);
    let event = |name: &str, data: Value| format!("event: {name}\r\ndata: {data}\r\n\r\n");
    let events = vec![
        event(
            "message_start",
            serde_json::json!({"type": "message_start", "message": {
                "id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": request["model"],
                "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": input, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 1}
            }}),
        ),
        event(
            "content_block_start",
            serde_json::json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ),
        event("ping", serde_json::json!({"type": "ping"})),
        event(
            "content_block_delta",
            serde_json::json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hello"}}),
        ),
        event("content_block_stop", serde_json::json!({"type": "content_block_stop", "index": 0})),
        event(
            "message_delta",
            serde_json::json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null},
                "usage": {"output_tokens": output}}),
        ),
    ];
    let hang = headers.contains_key("x-fake-hang");
    let mut events = events;
    if !hang {
        events.push(event("message_stop", serde_json::json!({"type": "message_stop"})));
    }
    streamed(events, hang)
}

/// The request fields the tests' Anthropic requests use (the real API knows more, and refuses
/// any it does not know).
const ANTHROPIC_FIELDS: [&str; 5] = ["model", "max_tokens", "messages", "stream", "system"];

/// A 400 `invalid_request_error`, as Anthropic and OpenAI say it.
fn refused(message: &str) -> Response {
    let error = serde_json::json!({"type": "error", "error": {"type": "invalid_request_error", "message": message}});
    Response::builder()
        .status(400)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(error.to_string()))
        .unwrap()
}

/// `POST /v1/responses`, OpenAI's Responses API, streamed: typed events, the usage in the last
/// one's `response` (sent unasked), no `[DONE]`; its `stream_options` knows no `include_usage`.
async fn responses(headers: HeaderMap, body: Bytes) -> Response {
    let request: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(request["stream"], true, "the tests stream");
    if request["stream_options"].get("include_usage").is_some() {
        return refused("Unknown parameter: 'stream_options.include_usage'.");
    }
    let (input, output) = counts(&headers);
    let event = |name: &str, data: Value| format!("event: {name}\ndata: {data}\n\n");
    let response = |status: &str, usage: Value| {
        serde_json::json!({"id": "resp_1", "object": "response", "status": status, "model": request["model"],
            "output": [], "usage": usage})
    };
    let usage = serde_json::json!({"input_tokens": input, "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": input + output});
    let events = vec![
        event(
            "response.created",
            serde_json::json!({"type": "response.created", "sequence_number": 0, "response": response("in_progress", Value::Null)}),
        ),
        event(
            "response.output_text.delta",
            serde_json::json!({"type": "response.output_text.delta", "sequence_number": 1, "item_id": "msg_1",
                "output_index": 0, "content_index": 0, "delta": "Hello"}),
        ),
        event(
            "response.completed",
            serde_json::json!({"type": "response.completed", "sequence_number": 2, "response": response("completed", usage)}),
        ),
    ];
    streamed(events, false)
}

async fn upstream() -> String {
    let app = Router::new()
        .route("/v1/chat/completions", post(openai))
        .route("/v1/messages", post(anthropic))
        .route("/v1/responses", post(responses));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{address}")
}

async fn start(config: Config, upstream: &str, rules: &str) -> Proxy {
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

/// curl `POST path` with a JSON body, the API key `key` and the fake upstream's counts; the
/// status, the `RateLimit` field (without its reset), and the body.
async fn call(proxy: &Proxy, path: &str, key: &str, usage: &str, body: &str) -> (u16, String, String) {
    let args = vec![
        "-N".to_string(),
        "-X".into(),
        "POST".into(),
        proxy.url(path),
        "-H".into(),
        format!("x-api-key: {key}"),
        "-H".into(),
        format!("x-fake-usage: {usage}"),
        "-H".into(),
        "content-type: application/json".into(),
        "--data".into(),
        body.into(),
    ];
    let (status, text) = curl(args).await;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    // `"tokens";r=900;t=…`: the policy and what is left (the reset depends on the clock).
    let field = head.lines().find_map(|l| l.strip_prefix("ratelimit: ")).unwrap_or("");
    let field = field.split(";t=").next().unwrap_or("").to_string();
    (status, field, body.to_string())
}

const TOTAL: &str = "[[rules]]\nname = \"tokens\"\nlimit = \"1000/1h\"\nalgorithm = \"fixed-window\"\n\
     key = [\"header:x-api-key\"]\ncost = \"response.usage.total_tokens\"\nestimate = 100\n\
     match = { path = \"/v1/chat/completions\" }\n";

/// An OpenAI stream with `include_usage`, then a completion that is not streamed: the budget each
/// next request reports reads the tokens they said (its own estimate reserved on top).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_budget_reads_the_tokens_an_openai_stream_and_a_completion_said() {
    let up = upstream().await;
    let proxy = start(common::manual_config(), &up, TOTAL).await;
    let stream = r#"{"model":"gpt-4o","messages":[{"role":"user","content":"Hi"}],"stream":true,"stream_options":{"include_usage":true}}"#;
    let (status, field, body) = call(&proxy, "/v1/chat/completions", "k1", "19,10", stream).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"total_tokens\":29") && body.ends_with("data: [DONE]\n\n"), "passed on unchanged: {body}");
    assert_eq!(field, "\"tokens\";r=900", "its own estimate reserved");
    let plain = r#"{"model":"gpt-4o","messages":[{"role":"user","content":"Hi"}]}"#;
    let (status, field, _) = call(&proxy, "/v1/chat/completions", "k1", "9,12", plain).await;
    assert_eq!((status, field.as_str()), (200, "\"tokens\";r=871"), "1000 - 29 streamed - 100 reserved");
    let (_, field, _) = call(&proxy, "/v1/chat/completions", "k1", "1,1", plain).await;
    assert_eq!(field, "\"tokens\";r=850", "1000 - 29 - 21 - 100 reserved");
    // A stream without include_usage is asked for it by the proxy: its 10 tokens are charged,
    // and the client gets the stream it asked for, without the usage chunk.
    let silent = r#"{"model":"gpt-4o","messages":[],"stream":true}"#;
    let (_, _, body) = call(&proxy, "/v1/chat/completions", "k1", "5,5", silent).await;
    assert!(!body.contains("\"choices\":[]") && body.ends_with("data: [DONE]\n\n"), "no usage chunk: {body}");
    let (_, field, _) = call(&proxy, "/v1/chat/completions", "k1", "0,0", plain).await;
    assert_eq!(field, "\"tokens\";r=838", "1000 - 29 - 21 - 2 - 10 - 100 reserved");
    let metrics = proxy.metrics().await;
    assert!(metrics.contains("tollgate_rule_decisions_total{rule=\"tokens\",outcome=\"counted\"} 5"), "{metrics}");
    proxy.stop().await;
}

const SPLIT: &str = "[[rules]]\nname = \"input\"\nlimit = \"1000/1h\"\nalgorithm = \"fixed-window\"\n\
     key = [\"header:x-api-key\"]\ncost = \"response.usage.input_tokens\"\nestimate = 100\n\
     [[rules]]\nname = \"output\"\nlimit = \"500/1h\"\nalgorithm = \"fixed-window\"\n\
     key = [\"header:x-api-key\"]\ncost = \"response.usage.output_tokens\"\nestimate = 10\n";

/// What is left of `key`'s budget under `rule` (a 1-hour fixed window of `count`), read from Redis.
async fn left(store: &RedisStore, rule: &str, count: u64, key: &str) -> u64 {
    let limit = Limit::per_hour(count).algorithm(Algorithm::FixedWindow).build().unwrap();
    store.check_one(Check::new(key.as_bytes(), &limit, 0).scoped(rule)).await.unwrap().remaining
}

/// Waits (at most 10 s) until `key`'s budgets under input and output read `wanted`.
async fn eventually(store: &RedisStore, key: &str, wanted: (u64, u64)) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let seen = (left(store, "input", 1000, key).await, left(store, "output", 500, key).await);
        if seen == wanted {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{key}: (input, output) left {seen:?}, wanted {wanted:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Separate input and output limits on one Anthropic stream, each settled from its own field, on
/// a real Redis; then a client that leaves mid-stream, after the upstream said 120 output tokens:
/// charged those 120 (past its estimate of 10), and its input at least its estimate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_and_output_limits_settle_from_their_own_fields_and_a_client_leaving_pays_what_was_streamed() {
    let server = RedisServer::start();
    let up = upstream().await;
    let config = Config { store: StoreConfig::redis(&server.url()), ..common::manual_config() };
    let proxy = start(config, &up, SPLIT).await;
    let store = RedisStore::open(&server.url(), RedisOptions::default()).unwrap();
    let body =
        r#"{"model":"claude-sonnet-4-5","max_tokens":1024,"stream":true,"messages":[{"role":"user","content":"Hi"}]}"#;
    let (status, _, text) = call(&proxy, "/v1/messages", "k2", "25,15", body).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("\"output_tokens\":15") && text.contains("message_stop"), "{text}");
    eventually(&store, "k2", (975, 485)).await;

    // The client reads up to the message_delta, then leaves while the upstream goes on pinging.
    let mut client = TcpStream::connect(proxy.at).await.unwrap();
    let request = format!(
        "POST /v1/messages HTTP/1.1\r\nhost: localhost\r\nx-api-key: k3\r\nx-fake-usage: 30,120\r\nx-fake-hang: 1\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    client.write_all(request.as_bytes()).await.unwrap();
    let mut seen = Vec::new();
    let mut buffer = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("\"output_tokens\":120") {
        let n = tokio::time::timeout(Duration::from_secs(10), client.read(&mut buffer)).await.unwrap().unwrap();
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buffer[..n]);
    }
    assert_eq!((left(&store, "input", 1000, "k3").await, left(&store, "output", 500, "k3").await), (900, 490));
    drop(client);
    eventually(&store, "k3", (900, 380)).await;
    proxy.stop().await;
}

const FROM_REQUEST: &str = "[[rules]]\nname = \"output\"\nlimit = \"5000/1h\"\nalgorithm = \"fixed-window\"\n\
     key = [\"header:x-api-key\"]\ncost = \"response.usage.output_tokens\"\n\
     estimate = \"request.json.max_tokens\"\nestimate_default = 2000\n";

/// The estimate read from the request's `max_tokens` (the default when it gives none), then
/// settled by the stream: each next request reports its own reservation on what was settled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_estimate_is_read_from_the_requests_max_tokens() {
    let up = upstream().await;
    let proxy = start(common::manual_config(), &up, FROM_REQUEST).await;
    let with = |max: &str| {
        format!(r#"{{"model":"claude-sonnet-4-5",{max}"stream":true,"messages":[{{"role":"user","content":"Hi"}}]}}"#)
    };
    let (status, field, text) = call(&proxy, "/v1/messages", "k4", "25,15", &with("\"max_tokens\":1024,")).await;
    assert_eq!((status, field.as_str()), (200, "\"output\";r=3976"), "5000 - 1024 reserved: {text}");
    assert!(text.contains("message_stop"), "{text}");
    let (_, field, _) = call(&proxy, "/v1/messages", "k4", "25,15", &with("")).await;
    assert_eq!(field, "\"output\";r=2985", "5000 - 15 settled - 2000 by default");
    proxy.stop().await;
}

const FROM_HEADER: &str = "[[rules]]\nname = \"tokens\"\nlimit = \"1000/1h\"\nalgorithm = \"fixed-window\"\n\
     key = [\"header:x-api-key\"]\ncost = \"response.header.x-tokens-used\"\nestimate = 100\n";

/// A cost read from a response header; a response without it keeps the estimate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cost_read_from_a_response_header_settles_the_estimate() {
    let up = upstream().await;
    let proxy = start(common::manual_config(), &up, FROM_HEADER).await;
    let plain = r#"{"model":"gpt-4o","messages":[]}"#;
    call(&proxy, "/v1/chat/completions", "k5", "200,50", plain).await;
    let (_, field, _) = call(&proxy, "/v1/chat/completions", "k5", "0,0", plain).await;
    assert_eq!(field, "\"tokens\";r=650", "1000 - 250 said by the header - 100 reserved");
    // A stream carries no such header: its estimate stays charged.
    call(&proxy, "/v1/chat/completions", "k5", "1,1", r#"{"model":"gpt-4o","messages":[],"stream":true}"#).await;
    let (_, field, _) = call(&proxy, "/v1/chat/completions", "k5", "0,0", plain).await;
    assert_eq!(field, "\"tokens\";r=550", "1000 - 250 - 0 - 100 kept - 100 reserved");
    proxy.stop().await;
}

const RESPONSES: &str = "[[rules]]\nname = \"tokens\"\nlimit = \"1000/1h\"\nalgorithm = \"fixed-window\"\n\
     key = [\"header:x-api-key\"]\ncost = \"response.usage.total_tokens\"\nestimate = 100\n";

/// A streamed request to OpenAI's Responses API reaches it as the client sent it (that API
/// refuses `stream_options.include_usage`, and says its usage unasked), and is charged the
/// `total_tokens` its `response.completed` event says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_responses_api_stream_is_passed_on_as_sent_and_charged_what_its_last_event_said() {
    let up = upstream().await;
    let proxy = start(common::manual_config(), &up, RESPONSES).await;
    let body = r#"{"model":"gpt-4.1","input":"Hi","stream":true}"#;
    let (status, field, text) = call(&proxy, "/v1/responses", "k6", "36,87", body).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("\"total_tokens\":123") && text.contains("response.completed"), "{text}");
    assert_eq!(field, "\"tokens\";r=900", "its own estimate reserved");
    let (_, field, _) = call(&proxy, "/v1/responses", "k6", "1,1", body).await;
    assert_eq!(field, "\"tokens\";r=777", "1000 - 123 said - 100 reserved");
    proxy.stop().await;
}
