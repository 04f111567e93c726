//! Store errors at the engine, on the testkit's faulty store (a memory store whose calls fail on
//! demand, or decide and lose their reply): the rules' `on_error` answers, never silently
//! (`reject`: 503, the default; `allow`: let through, charged nowhere), counted per rule
//! (`outcome="error"`) and by kind (`tollgate_store_errors_total`); for one rule or several, and
//! for a caller naming a rule. A dry-run rule's error never refuses; a failed refund leaves the
//! reservation counted (an under-grant); a lost reply never over-grants; a mitigation in force
//! answers without the store. (`on_error` is one setting for the whole file, not per rule.)

mod support;

use support::{Harness, build, clock, get, memory, post, secs};
use tollgate_engine::{EngineError, Frontend};
use tollgate_store::MemoryStore;
use tollgate_store::testkit::faults::{Fault, Faulty};

type Faulted = Harness<Faulty<MemoryStore>>;

fn faulty(rules: &str) -> Faulted {
    let clock = clock();
    build(Faulty::new(memory(&clock)), clock, rules, false)
}

impl Faulted {
    fn fail(&self, fault: Fault) {
        self.engine.store().set(fault);
    }

    fn errors(&self, kind: &str) -> u64 {
        self.series(&format!("tollgate_store_errors_total{{kind=\"{kind}\"}}"))
    }
}

const TWO_RULES: &str = "[[rules]]\nname = \"a\"\nlimit = \"10/1m\"\nalgorithm = \"fixed-window\"\nkey = [\"global\"]\n\
     match = { path_prefix = \"/both\" }\n\
     [[rules]]\nname = \"b\"\nlimit = \"5/1m\"\nkey = [\"client_ip\"]\nmatch = { path_prefix = \"/both\" }\n\
     [[rules]]\nname = \"solo\"\nlimit = \"5/1m\"\nalgorithm = \"sliding-log\"\nkey = [\"client_ip\"]\n\
     match = { path = \"/solo\" }\n";

/// By default a store error is a 503, for a request one rule counts and one several count, each
/// rule counting an `error`; once the store answers, nothing was charged by the failed requests.
#[tokio::test]
async fn a_store_error_is_a_503_by_default_counted_for_each_rule() {
    let h = faulty(TWO_RULES);
    assert_eq!(h.errors("backend"), 0, "a remote store's error series exist from the start");
    h.fail(Fault::Refuse);
    assert_eq!(h.outcome(&get("/both")).await, "503");
    assert_eq!(h.outcome(&get("/solo")).await, "503");
    let errors = [h.counted("a", "error"), h.counted("b", "error"), h.counted("solo", "error")];
    assert_eq!(errors, [1, 1, 1]);
    assert_eq!(h.errors("backend"), 2);
    h.fail(Fault::None);
    assert_eq!(h.outcome(&get("/both")).await, "proceed");
    assert_eq!(h.outcome(&get("/solo")).await, "proceed");
    assert_eq!((h.remaining("a", "").await, h.remaining("b", "192.0.2.1").await), (9, 4));
    assert_eq!(h.remaining("solo", "192.0.2.1").await, 4);
}

/// `on_error = "allow"`: the request is let through with nothing to report or settle (a
/// `count_status` rule reserved nothing), counted as an `error`.
#[tokio::test]
async fn on_error_allow_lets_the_request_through_counted() {
    let h = faulty(&format!(
        "on_error = \"allow\"\n{TWO_RULES}[[rules]]\nname = \"failures\"\nlimit = \"3/1m\"\nkey = [\"client_ip\"]\n\
         count_status = [401]\nmatch = {{ path = \"/login\" }}\n"
    ));
    h.fail(Fault::Refuse);
    for target in ["/both", "/solo", "/login"] {
        let proceed = h.proceed(&get(target)).await;
        assert!(proceed.fields(&h.engine.policy()).is_none(), "{target}: no decision to report");
        assert!(proceed.pending.is_empty(), "{target}");
        h.engine.complete(proceed.pending, 200).await;
    }
    let errors = [h.counted("a", "error"), h.counted("solo", "error"), h.counted("failures", "error")];
    assert_eq!(errors, [1, 1, 1]);
    assert_eq!(h.counted("a", "allowed") + h.counted("failures", "refunded"), 0, "never counted as decided");
    assert_eq!(h.errors("backend"), 3);
    h.fail(Fault::None);
    assert_eq!(h.remaining("failures", "192.0.2.1").await, 3);
}

/// A dry-run rule is checked on its own: its store error is counted and refuses nothing, whatever
/// `on_error` says.
#[tokio::test]
async fn a_dry_run_rules_store_error_never_refuses() {
    let h = faulty(
        "[[rules]]\nname = \"trial\"\nlimit = \"1/1m\"\nkey = [\"global\"]\n[rules.mitigation]\naction = \"dry-run\"\n",
    );
    h.fail(Fault::Refuse);
    assert_eq!(h.outcomes(&get("/"), 2).await, ["proceed", "proceed"]);
    assert_eq!((h.counted("trial", "error"), h.counted("trial", "dry_run")), (2, 0));
}

/// A refund the store fails leaves the reservation counted (an under-grant, never an
/// over-grant), and the error is counted.
#[tokio::test]
async fn a_failed_refund_leaves_the_reservation_counted() {
    let h = faulty(
        "[[rules]]\nname = \"failures\"\nlimit = \"3/1m\"\nalgorithm = \"fixed-window\"\nkey = [\"client_ip\"]\n\
         count_status = [401]\n",
    );
    let proceed = h.proceed(&post("/login")).await;
    h.fail(Fault::Refuse);
    h.engine.complete(proceed.pending, 200).await;
    assert_eq!(h.errors("backend"), 1);
    h.fail(Fault::None);
    assert_eq!(h.remaining("failures", "192.0.2.1").await, 2, "still counted");
}

/// A call that reached the store, which decided, but whose reply was lost: the caller gets
/// `on_error`'s answer, counted as a timeout, and what the store admitted stays charged.
#[tokio::test]
async fn a_lost_reply_is_answered_by_on_error_and_stays_charged() {
    let h = faulty(&format!("on_error = \"allow\"\n{TWO_RULES}"));
    h.fail(Fault::LoseReply);
    assert_eq!(h.outcome(&get("/both")).await, "proceed");
    assert_eq!((h.errors("timeout"), h.errors("backend")), (1, 0));
    assert_eq!(h.engine.store().reached(), 1);
    h.fail(Fault::None);
    assert_eq!((h.remaining("a", "").await, h.remaining("b", "192.0.2.1").await), (9, 4), "decided: charged");
}

/// A key held by a rule's timeout is answered from the engine's own table: still 429 while the
/// store fails (other keys get `on_error`'s answer), and released when the timeout ends.
#[tokio::test]
async fn a_mitigation_in_force_answers_without_the_store() {
    let h = faulty(
        "on_error = \"allow\"\n[[rules]]\nname = \"per-ip\"\nlimit = \"1/1m\"\nkey = [\"client_ip\"]\n\
         [rules.mitigation]\ntimeout = \"5m\"\n",
    );
    assert_eq!(h.outcomes(&get("/"), 2).await, ["proceed", "429:per-ip"]);
    h.fail(Fault::Refuse);
    assert_eq!(h.outcome(&get("/")).await, "429:per-ip", "held, store or no store");
    assert_eq!(h.outcome(&get("/").from("192.0.2.2")).await, "proceed", "on_error = allow");
    assert_eq!(h.counted("per-ip", "error"), 1, "only the request the store was asked about");
    h.advance(secs(300));
    assert_eq!(h.outcome(&get("/")).await, "proceed", "released, then let through by on_error");
}

/// `TG.LIMIT` / `limit_name`: a store error is an error for `reject`, an admission for `allow`;
/// a peek has no `on_error` answer, only the store's error.
#[tokio::test]
async fn a_caller_naming_a_rule_gets_on_errors_answer() {
    for (on_error, admitted) in [("reject", false), ("allow", true)] {
        let h = faulty(&format!("on_error = \"{on_error}\"\n[limits.api]\nlimit = \"10/1m\"\n"));
        h.fail(Fault::Refuse);
        match h.engine.check_named(Frontend::Http, "api", b"k", 1).await {
            Ok((decision, _)) => assert!(admitted && decision.allowed, "{on_error}: {decision:?}"),
            Err(error) => {
                assert!(!admitted && matches!(error, EngineError::Unavailable(_)), "{on_error}: {error}");
                assert!(error.to_string().contains("store failed"), "{error}");
            }
        }
        let peek = h.engine.check_named(Frontend::Http, "api", b"k", 0).await;
        assert!(matches!(peek, Err(EngineError::Store(_))), "{on_error}: {peek:?}");
        assert_eq!(h.counted("api", "error"), 1, "{on_error}");
        assert_eq!(h.errors("backend"), 2, "{on_error}");
    }
}

/// Requests in flight when the store fails: the admitted ones keep going, what they reserved is
/// settled once the store is back.
#[tokio::test]
async fn reservations_made_before_an_outage_settle_after_it() {
    let h = faulty(
        "[[rules]]\nname = \"failures\"\nlimit = \"2/1m\"\nalgorithm = \"fixed-window\"\nkey = [\"client_ip\"]\n\
         count_status = [401]\n",
    );
    let proceed = h.proceed(&post("/login")).await;
    h.fail(Fault::Refuse);
    assert_eq!(h.outcome(&post("/login")).await, "503");
    h.fail(Fault::None);
    h.engine.complete(proceed.pending, 200).await;
    assert_eq!(h.remaining("failures", "192.0.2.1").await, 2, "refunded once the store answers");
}
