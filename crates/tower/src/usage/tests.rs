//! The usage readers on real-shaped bodies (OpenAI chat completions and Anthropic messages,
//! streamed and not), fed whole, split at every byte boundary and byte by byte, with LF, CRLF
//! and CR line ends, comments, multi-line data, and over the bounds.

use super::{MAX_EVENT_BYTES, MAX_JSON_BYTES, MAX_USAGE_BYTES, Reader};

/// An OpenAI chat completions stream with `stream_options.include_usage`: token chunks with
/// `"usage":null`, then a chunk with no choices and the usage, then `[DONE]`.
const OPENAI_STREAM: &str = concat!(
    "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",",
    "\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}],\"usage\":null}\n\n",
    "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",",
    "\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"},\"finish_reason\":null}],\"usage\":null}\n\n",
    "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",",
    "\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":null}\n\n",
    "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[],",
    "\"usage\":{\"prompt_tokens\":19,\"completion_tokens\":10,\"total_tokens\":29,",
    "\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\n",
    "data: [DONE]\n\n",
);

/// An Anthropic messages stream: `message_start` (input tokens), content events, a ping, then
/// `message_delta` with the cumulative output tokens, and `message_stop`.
const ANTHROPIC_STREAM: &str = concat!(
    "event: message_start\n",
    "data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",",
    "\"content\":[],\"model\":\"claude-sonnet-4-5\",\"stop_reason\":null,\"stop_sequence\":null,",
    "\"usage\":{\"input_tokens\":25,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":0,\"output_tokens\":1}}}\n\n",
    "event: content_block_start\n",
    "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
    "event: ping\n",
    "data: {\"type\": \"ping\"}\n\n",
    "event: content_block_delta\n",
    "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}\n\n",
    "event: content_block_stop\n",
    "data: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
    "event: message_delta\n",
    "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},",
    "\"usage\":{\"output_tokens\":15}}\n\n",
    "event: message_stop\n",
    "data: {\"type\":\"message_stop\"}\n\n",
);

/// An OpenAI Responses API stream (`POST /v1/responses` with `stream: true`): typed events, the
/// usage inside the `response` of the last one (`response.completed`), and no `[DONE]`.
const RESPONSES_STREAM: &str = concat!(
    "event: response.created\n",
    "data: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",",
    "\"object\":\"response\",\"created_at\":1,\"status\":\"in_progress\",\"model\":\"gpt-4.1\",",
    "\"output\":[],\"usage\":null}}\n\n",
    "event: response.in_progress\n",
    "data: {\"type\":\"response.in_progress\",\"sequence_number\":1,\"response\":{\"id\":\"resp_1\",",
    "\"object\":\"response\",\"status\":\"in_progress\",\"output\":[],\"usage\":null}}\n\n",
    "event: response.output_text.delta\n",
    "data: {\"type\":\"response.output_text.delta\",\"sequence_number\":4,\"item_id\":\"msg_1\",",
    "\"output_index\":0,\"content_index\":0,\"delta\":\"Hello\"}\n\n",
    "event: response.completed\n",
    "data: {\"type\":\"response.completed\",\"sequence_number\":8,\"response\":{\"id\":\"resp_1\",",
    "\"object\":\"response\",\"status\":\"completed\",\"output\":[],\"usage\":{\"input_tokens\":36,",
    "\"input_tokens_details\":{\"cached_tokens\":0},\"output_tokens\":87,",
    "\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":123}}}\n\n",
);

const OPENAI_JSON: &str = "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"choices\":[{\"index\":0,\
    \"message\":{\"role\":\"assistant\",\"content\":\"Hello\"},\"finish_reason\":\"stop\"}],\
    \"usage\":{\"prompt_tokens\":9,\"completion_tokens\":12,\"total_tokens\":21}}";

const ANTHROPIC_JSON: &str = "{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\
    \"content\":[{\"type\":\"text\",\"text\":\"Hello\"}],\"stop_reason\":\"end_turn\",\
    \"usage\":{\"input_tokens\":10,\"output_tokens\":7}}";

/// Reads `parts` in turn (then the end), as a body of `content_type` would be.
fn read(content_type: &str, parts: &[&[u8]]) -> Reader {
    let mut reader = Reader::new(Some(content_type.as_bytes()));
    for part in parts {
        reader.feed(part);
    }
    reader.finish();
    reader
}

/// The fields read of `body`, fed whole, split in two at every byte, and byte by byte: all the
/// same, returned once.
fn every_split(content_type: &str, body: &str, fields: &[&str]) -> Vec<Option<u64>> {
    let bytes = body.as_bytes();
    let of = |reader: &Reader| fields.iter().map(|f| reader.usage().get(f)).collect::<Vec<_>>();
    let whole = read(content_type, &[bytes]);
    for at in 0..=bytes.len() {
        let split = read(content_type, &[&bytes[..at], &bytes[at..]]);
        assert_eq!(of(&split), of(&whole), "split at byte {at}");
        assert_eq!(split.whole(), whole.whole(), "split at byte {at}");
    }
    let pieces: Vec<&[u8]> = bytes.chunks(1).collect();
    assert_eq!(of(&read(content_type, &pieces)), of(&whole), "byte by byte");
    assert!(whole.whole(), "the body was whole");
    of(&whole)
}

#[test]
fn an_openai_stream_says_its_usage_in_its_last_chunk() {
    let fields = ["prompt_tokens", "completion_tokens", "total_tokens", "cached_tokens"];
    assert_eq!(every_split("text/event-stream", OPENAI_STREAM, &fields), [Some(19), Some(10), Some(29), None]);
}

#[test]
fn an_openai_responses_stream_says_its_usage_in_its_completed_event() {
    let fields = ["input_tokens", "output_tokens", "total_tokens", "reasoning_tokens"];
    assert_eq!(every_split("text/event-stream", RESPONSES_STREAM, &fields), [Some(36), Some(87), Some(123), None]);
    let cut = RESPONSES_STREAM.find("event: response.completed").unwrap();
    let cut = read("text/event-stream", &[&RESPONSES_STREAM.as_bytes()[..cut]]);
    assert_eq!((cut.usage().get("total_tokens"), cut.whole()), (None, false), "a stream cut before its last event");
}

#[test]
fn an_anthropic_stream_says_input_at_the_start_and_cumulative_output_in_its_deltas() {
    let fields = ["input_tokens", "output_tokens"];
    assert_eq!(every_split("text/event-stream; charset=utf-8", ANTHROPIC_STREAM, &fields), [Some(25), Some(15)]);
}

#[test]
fn crlf_and_cr_line_ends_read_as_lf() {
    for end in ["\r\n", "\r"] {
        let stream = ANTHROPIC_STREAM.replace('\n', end);
        assert_eq!(every_split("text/event-stream", &stream, &["input_tokens", "output_tokens"]), [Some(25), Some(15)]);
        let stream = MULTI_LINE.replace('\n', end);
        assert_eq!(every_split("text/event-stream", &stream, &["output_tokens"]), [Some(42)], "{end:?}");
    }
}

/// Comments, fields other than `data`, and an event's data over several lines.
const MULTI_LINE: &str = concat!(
    ": keep-alive\n\n",
    "id: 7\nretry: 100\nevent: message_delta\n",
    "data: {\"type\":\"message_delta\",\n",
    "data:\"usage\":\n",
    "data:  {\"output_tokens\":42}}\n",
    ": a comment inside an event\n",
    "\n",
    "data:{\"type\":\"message_stop\"}\n\n",
);

#[test]
fn comments_other_fields_and_multi_line_data_are_read_as_the_grammar_says() {
    assert_eq!(every_split("text/event-stream", MULTI_LINE, &["output_tokens"]), [Some(42)]);
}

#[test]
fn json_bodies_say_their_usage_once_whole() {
    let fields = ["prompt_tokens", "completion_tokens", "total_tokens"];
    assert_eq!(every_split("application/json", OPENAI_JSON, &fields), [Some(9), Some(12), Some(21)]);
    let fields = ["input_tokens", "output_tokens"];
    assert_eq!(every_split("application/json", ANTHROPIC_JSON, &fields), [Some(10), Some(7)]);
    let cut = read("application/json", &[&OPENAI_JSON.as_bytes()[..OPENAI_JSON.len() - 1]]);
    assert_eq!((cut.usage().get("total_tokens"), cut.whole()), (None, false), "a cut JSON body says nothing");
}

#[test]
fn a_stream_cut_short_says_what_it_gave_and_is_not_whole() {
    let cut = ANTHROPIC_STREAM.find("event: content_block_delta").unwrap();
    let reader = read("text/event-stream", &[&ANTHROPIC_STREAM.as_bytes()[..cut]]);
    assert_eq!((reader.usage().get("input_tokens"), reader.usage().get("output_tokens")), (Some(25), Some(1)));
    assert!(!reader.whole());
    // An event the body ends inside is not dispatched.
    let last = OPENAI_STREAM.find("data: [DONE]").unwrap() - 2;
    let reader = read("text/event-stream", &[&OPENAI_STREAM.as_bytes()[..last]]);
    assert_eq!((reader.usage().get("total_tokens"), reader.whole()), (None, false));
}

#[test]
fn other_content_types_and_bodies_over_the_bounds_are_not_read() {
    assert_eq!(read("text/plain", &[OPENAI_JSON.as_bytes()]).usage().get("total_tokens"), None);
    assert_eq!(Reader::new(None).usage().get("total_tokens"), None);
    // An encoded body is not read, and is not taken to say it has no usage.
    for coding in ["gzip", "identity, br"] {
        let encoded = read_encoded(Some(coding));
        assert_eq!((encoded.usage().get("total_tokens"), encoded.readable()), (None, false), "{coding}");
    }
    let identity = read_encoded(Some("identity"));
    assert_eq!((identity.usage().get("total_tokens"), identity.readable()), (Some(21), true));
    // A JSON body of any length is read (only its usage is kept); a usage past its bound is not.
    let padding = " ".repeat(MAX_JSON_BYTES);
    let long = read("application/json", &[padding.as_bytes(), OPENAI_JSON.as_bytes()]);
    assert_eq!((long.usage().get("total_tokens"), long.whole()), (Some(21), true));
    let padded = format!(r#"{{"usage":{{"total_tokens":5,"pad":"{}"}}}}"#, "x".repeat(MAX_USAGE_BYTES));
    let long_usage = read("application/json", &[padded.as_bytes()]);
    assert_eq!(long_usage.usage().get("total_tokens"), None);
    // An event past the bound is unread; the events after it are read.
    let big = format!(
        "data: {{\"usage\":{{\"output_tokens\":5}},\"pad\":\"{}\"}}\n\ndata: {{\"usage\":{{\"input_tokens\":3}}}}\n\n",
        "x".repeat(MAX_EVENT_BYTES)
    );
    let reader = read("text/event-stream", &[big.as_bytes()]);
    assert_eq!((reader.usage().get("output_tokens"), reader.usage().get("input_tokens")), (None, Some(3)));
    // Ended as its format says, but with an event unread: its counts are not final.
    let ended = format!("{big}data: [DONE]\n\n");
    assert!(!read("text/event-stream", &[ended.as_bytes()]).whole(), "an event was skipped");
}

#[test]
fn values_that_are_not_counts_are_ignored() {
    let stream = "data: {\"usage\":{\"total_tokens\":-1,\"input_tokens\":1.5,\"output_tokens\":\"9\"}}\n\n\
                  data: {\"usage\":[1,2]}\n\ndata: not json \"usage\"\n\n";
    let reader = read("text/event-stream", &[stream.as_bytes()]);
    for field in ["total_tokens", "input_tokens", "output_tokens"] {
        assert_eq!(reader.usage().get(field), None, "{field}");
    }
}

#[test]
fn request_values_are_the_integer_fields_of_a_json_body() {
    let rules = tollgate_rules::Rules::parse(
        "[[rules]]\nname = \"out\"\nlimit = \"1000/1m\"\nkey = [\"global\"]\ncost = \"response.usage.output_tokens\"\n\
         estimate = \"request.json.max_tokens\"\nestimate_default = 7\n\
         [[rules]]\nname = \"deep\"\nlimit = \"1000/1m\"\nkey = [\"global\"]\ncost = \"response.usage.total_tokens\"\n\
         estimate = \"request.json.options.num_predict\"\nestimate_default = 7\n",
        "t",
    )
    .unwrap();
    let fields = rules.request_fields();
    let read = |body: &str| {
        let values = super::RequestValues::read(&fields, body.as_bytes());
        values.pairs().map(|(n, v)| format!("{n}={}", String::from_utf8_lossy(v))).collect::<Vec<_>>()
    };
    assert_eq!(
        read(r#"{"max_tokens": 1024, "options": {"num_predict": 64}}"#),
        [":request.json.max_tokens=1024", ":request.json.options.num_predict=64"]
    );
    assert_eq!(read(r#"{"max_tokens": "1024", "options": 3}"#), Vec::<String>::new(), "not counts");
    assert_eq!(read("max_tokens=1024"), Vec::<String>::new(), "not JSON");
    let long = format!(r#"{{"max_tokens": 5, "pad": "{}"}}"#, "x".repeat(MAX_JSON_BYTES));
    assert_eq!(read(&long), Vec::<String>::new(), "over the bound");
}

/// OpenAI's JSON completion read as encoded by `coding`.
fn read_encoded(coding: Option<&str>) -> Reader {
    let mut reader = Reader::encoded_as(Some(b"application/json"), coding.map(str::as_bytes));
    reader.feed(OPENAI_JSON.as_bytes());
    reader.finish();
    reader
}
