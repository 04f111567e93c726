//! The keys a rule holds under mitigation share one bounded table, and no rule's holds can end
//! another's early: a full table makes room in the rule holding the most (an enforced rule first
//! in the dry-run rules' holds), and a dry-run rule never drops an enforced rule's hold. Each
//! test puts `victim` over the `login` rule (held 60 s), floods the table with another rule's
//! holds on keys a client chooses, and checks that `victim` is still held once `login`'s own
//! limit would admit it again. The store keeps no holds here ([`NoHolds`]): the table alone holds
//! (a store that keeps them holds every key besides: see `fleet_holds.rs`).

mod support;

use support::{Harness, NoHolds, holding, ms, post, secs};

/// Each test's table: 10 holds a shard, so that a flood of 2,000 keys fills every shard.
const MAX_BLOCKS: usize = 160;

/// `login` (1 a second per client, held 60 s once over) and a rule on `/flood` keyed on a value
/// the client chooses, held an hour, with `action`.
fn rules(action: &str) -> String {
    format!(
        "[[rules]]\nname = \"login\"\nlimit = \"1/1s\"\nalgorithm = \"fixed-window\"\nkey = [\"client_ip\"]\n\
         match = {{ path = \"/login\" }}\n[rules.mitigation]\ntimeout = \"60s\"\n\
         [[rules]]\nname = \"flood\"\nlimit = \"1/1h\"\nalgorithm = \"fixed-window\"\nkey = [\"header:x-k\"]\n\
         match = {{ path = \"/flood\" }}\n[rules.mitigation]\naction = \"{action}\"\ntimeout = \"1h\"\n"
    )
}

/// Puts `victim` over `login`, then `keys` keys over the flood rule (each sent twice, the second
/// over: held an hour from then; a millisecond between keys, as on a real clock), then moves past
/// `login`'s own window.
async fn victim_then_flood(h: &Harness<NoHolds>, keys: u32) {
    let victim = post("/login").from("198.51.100.9");
    assert_eq!(h.outcomes(&victim, 2).await, ["proceed", "429:login"]);
    for i in 0..keys {
        let request = post("/flood").header("x-k", &format!("k{i}"));
        h.outcome(&request).await;
        h.outcome(&request).await;
        h.advance(ms(1));
    }
    h.advance(secs(2));
}

/// Before: the flood's hour-long holds filled the table, and every full shard dropped its holds
/// that end soonest: `victim`'s 60 s hold was among them, and `victim` was let through after 2 s.
#[tokio::test]
async fn an_enforced_rules_flood_of_holds_ends_no_other_rules_hold() {
    let h = holding(&rules("reject"), MAX_BLOCKS);
    victim_then_flood(&h, 2_000).await;
    assert_eq!(h.outcome(&post("/login").from("198.51.100.9")).await, "429:login", "still held");
    let held = h.series("tollgate_blocked_keys");
    assert!(held <= MAX_BLOCKS as u64, "the table stays bounded: {held}");
    assert!(h.series("tollgate_blocks_dropped_total") > 1_000, "the flood made room in its own holds");
}

/// Issue 36 item 4. Before: 2,000 keys over a dry-run rule with an hour's timeout dropped the
/// enforced `login` rule's hold on `victim`, who was let through after 2 s. A dry-run rule changes
/// nothing an enforced rule decides, its holds included.
#[tokio::test]
async fn a_dry_run_rules_holds_never_drop_an_enforced_hold() {
    let h = holding(&rules("dry-run"), MAX_BLOCKS);
    victim_then_flood(&h, 2_000).await;
    assert_eq!(h.outcome(&post("/login").from("198.51.100.9")).await, "429:login", "still held");
    assert!(h.series("tollgate_blocked_keys") <= MAX_BLOCKS as u64);
    assert_eq!(h.counted("flood", "dry_run"), 2_000, "the dry-run rule still reports every key it would hold");
}

/// Enforced holds fill most of the table (120 keys over `login`, 7.5 a shard of 10 on average),
/// then 2,000 keys go over a dry-run rule: where `login` holds the most, fairness alone would make
/// room in its holds; a dry-run hold never does. Before: the dry-run holds, ending later, dropped
/// every `login` hold.
#[tokio::test]
async fn a_dry_run_flood_drops_no_enforced_hold_where_enforced_holds_fill_the_table() {
    let h = holding(
        "[[rules]]\nname = \"login\"\nlimit = \"1/1s\"\nalgorithm = \"fixed-window\"\nkey = [\"header:x-k\"]\n\
         match = { path = \"/login\" }\n[rules.mitigation]\ntimeout = \"60s\"\n\
         [[rules]]\nname = \"trial\"\nlimit = \"1/1h\"\nalgorithm = \"fixed-window\"\nkey = [\"header:x-k\"]\n\
         match = { path = \"/trial\" }\n[rules.mitigation]\naction = \"dry-run\"\ntimeout = \"1h\"\n",
        MAX_BLOCKS,
    );
    let logins: Vec<_> = (0..120).map(|i| post("/login").header("x-k", &format!("u{i}"))).collect();
    for request in &logins {
        assert_eq!(h.outcomes(request, 2).await, ["proceed", "429:login"]);
    }
    // Some shards got more than 10: the table bounded `login` by its own holds.
    let held = h.series("tollgate_blocked_keys");
    assert!((60..=MAX_BLOCKS as u64).contains(&held), "{held}");
    for i in 0..2_000 {
        let request = post("/trial").header("x-k", &format!("t{i}"));
        h.outcome(&request).await;
        h.outcome(&request).await;
        h.advance(ms(1));
    }
    h.advance(secs(2));
    let mut still = 0;
    for request in &logins {
        still += u64::from(h.outcome(request).await == "429:login");
    }
    assert_eq!(still, held, "every login hold is kept");
}
