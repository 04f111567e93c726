//! Rules whose cost is read from the response (LLM tokens), at the engine: the estimate is
//! reserved at admission, all or nothing with the request's other limits; the response settles
//! it ([`Engine::complete_with`]): less refunded, more charged past the limit (the next request
//! pays), a response that does not say keeps the estimate, no response at all refunds it.
//!
//! [`Engine::complete_with`]: tollgate_engine::Engine::complete_with

mod support;

use support::{harness, post};
use tollgate_engine::Actual;
use tollgate_rules::ResponseCost;

const TOKENS: &str = "[[rules]]\nname = \"input\"\nlimit = \"1000/1m\"\nalgorithm = \"fixed-window\"\n\
     key = [\"client_ip\"]\ncost = \"response.usage.prompt_tokens\"\nestimate = 100\n\
     [[rules]]\nname = \"output\"\nlimit = \"1000/1m\"\nalgorithm = \"fixed-window\"\n\
     key = [\"client_ip\"]\ncost = \"response.usage.completion_tokens\"\nestimate = 300\n";

/// What an OpenAI-shaped response says: `prompt_tokens` and `completion_tokens`.
fn said(prompt: u64, completion: u64) -> impl Fn(&ResponseCost) -> Option<Actual> + Sync {
    move |from| match from {
        ResponseCost::Usage(field) if field == "prompt_tokens" => Some(Actual::Final(prompt)),
        ResponseCost::Usage(field) if field == "completion_tokens" => Some(Actual::Final(completion)),
        _ => None,
    }
}

#[tokio::test]
async fn each_limit_reserves_its_estimate_and_settles_from_its_own_field() {
    let h = harness(TOKENS);
    let ip = "192.0.2.1";
    let proceed = h.proceed(&post("/v1/chat/completions")).await;
    assert_eq!((h.remaining("input", ip).await, h.remaining("output", ip).await), (900, 700), "estimates reserved");
    h.engine.complete_with(proceed.pending, 200, said(40, 500)).await;
    assert_eq!(
        (h.remaining("input", ip).await, h.remaining("output", ip).await),
        (960, 500),
        "input: 60 of 100 refunded; output: 200 past the estimate charged"
    );
}

#[tokio::test]
async fn more_than_the_limit_is_charged_and_the_next_request_pays() {
    let h = harness(TOKENS);
    let ip = "192.0.2.1";
    let proceed = h.proceed(&post("/v1/chat/completions")).await;
    h.engine.complete_with(proceed.pending, 200, said(100, 1200)).await;
    assert_eq!(h.remaining("output", ip).await, 0, "1200 charged of 1000: in debt");
    assert_eq!(h.outcome(&post("/v1/chat/completions")).await, "429:output");
}

/// A stream cut short settles at the larger of the last count it gave and the estimate: more
/// charged, nothing refunded (the rest of the stream might have said more).
#[tokio::test]
async fn a_stream_cut_short_is_charged_at_least_its_estimate() {
    let h = harness(TOKENS);
    let ip = "192.0.2.1";
    let proceed = h.proceed(&post("/v1/chat/completions")).await;
    let cut = |from: &ResponseCost| match from {
        ResponseCost::Usage(field) if field == "prompt_tokens" => Some(Actual::AtLeast(30)),
        _ => Some(Actual::AtLeast(420)),
    };
    h.engine.complete_with(proceed.pending, 200, cut).await;
    assert_eq!((h.remaining("input", ip).await, h.remaining("output", ip).await), (900, 580));
}

#[tokio::test]
async fn a_response_that_does_not_say_keeps_the_estimate_and_no_response_refunds_it() {
    let h = harness(TOKENS);
    let ip = "192.0.2.1";
    let proceed = h.proceed(&post("/v1/chat/completions")).await;
    h.engine.complete_with(proceed.pending, 500, |_| None).await;
    assert_eq!((h.remaining("input", ip).await, h.remaining("output", ip).await), (900, 700));
    let proceed = h.proceed(&post("/v1/chat/completions")).await;
    let engine = std::sync::Arc::new(h.engine);
    drop(engine.unsettled(proceed.pending));
    let (input, output) = (support_remaining(&engine, "input").await, support_remaining(&engine, "output").await);
    assert_eq!((input, output), (900, 700), "dropped before any response: refunded");
}

/// The remaining of `rule` for the test's client, read on a shared engine.
async fn support_remaining(engine: &tollgate_engine::Engine<tollgate_store::MemoryStore>, rule: &str) -> u64 {
    use tollgate_store::Store;
    let policy = engine.policy();
    let (_, rule) = policy.rules.named(rule).unwrap();
    let check = tollgate_store::Check::new(b"192.0.2.1", &rule.limit, 0).scoped(&rule.name);
    engine.store().check_one(check).await.unwrap().remaining
}

/// A request under one such rule alone (no fast path that only checks: it must be reserved and
/// settled like any other).
#[tokio::test]
async fn a_rule_alone_reserves_and_settles_too() {
    let h = harness(
        "[[rules]]\nname = \"tokens\"\nlimit = \"1000/1m\"\nalgorithm = \"fixed-window\"\nkey = [\"client_ip\"]\n\
         cost = \"response.usage.total_tokens\"\nestimate = 100\n",
    );
    let proceed = h.proceed(&post("/v1/chat/completions")).await;
    assert!(!proceed.pending.is_empty(), "reserved, to be settled");
    let total = |_: &ResponseCost| Some(Actual::Final(29));
    h.engine.complete_with(proceed.pending, 200, total).await;
    assert_eq!(h.remaining("tokens", "192.0.2.1").await, 971);
}
