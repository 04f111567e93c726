//! Reloading the policy at the engine: a rule that keeps its name keeps its keys' counts, also
//! when its algorithm changes (each key's use is carried into the new algorithm's state on its
//! first request after the reload, never more than the old state had used); the rules and Envoy's
//! configuration each reload on their own and keep the other, and a watched file is reloaded when
//! it changes, a broken one keeping the policy in force.

mod support;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_client::registry::Registry;
use support::{build_tuned, clock, get, harness, memory, secs};
use tollgate_engine::reload::{self, PolicyFile};
use tollgate_engine::{Descriptor, Engine, Verdict};
use tollgate_rules::Rules;
use tollgate_store::Store;

const ALGORITHMS: [&str; 7] =
    ["gcra", "token-bucket", "leaky-bucket", "fixed-window", "sliding-log", "sliding-window", "sub-window"];

/// The rule `lock`: 3 per hour per client, under `algorithm`.
fn lock(algorithm: &str) -> String {
    format!("[[rules]]\nname = \"lock\"\nlimit = \"3/1h\"\nalgorithm = \"{algorithm}\"\nkey = [\"client_ip\"]\n")
}

/// Before: state was found by (rule, algorithm, key), so `lock` at 3/1h, spent (1, 1, 1, 0) and
/// reloaded as a fixed window admitted 1, 1, 1, 0 again. Now every pair of algorithms keeps the
/// count: two spent before the reload leave one after it.
#[tokio::test]
async fn a_rule_that_changes_its_algorithm_keeps_its_counts() {
    for from in ALGORITHMS {
        for to in ALGORITHMS.iter().filter(|&&to| to != from) {
            let h = harness(&lock(from));
            let (a, b) = (get("/").from("192.0.2.1"), get("/").from("192.0.2.2"));
            assert_eq!(h.outcomes(&a, 2).await, ["proceed", "proceed"], "{from}");
            assert_eq!(h.outcomes(&b, 3).await, ["proceed", "proceed", "proceed"], "{from}");
            h.engine.reload(Rules::parse(&lock(to), "t").unwrap());
            assert_eq!(h.outcomes(&a, 2).await, ["proceed", "429:lock"], "{from} -> {to}: 2 spent before");
            assert_eq!(h.outcomes(&b, 1).await, ["429:lock"], "{from} -> {to}: 3 spent before");
            let fresh = get("/").from("192.0.2.3");
            assert_eq!(h.outcomes(&fresh, 4).await, ["proceed", "proceed", "proceed", "429:lock"], "{from} -> {to}");
        }
    }
}

/// The count carried is what the old state had used at the first request after the reload: a
/// bucket that drained meanwhile carries less; reloaded again, the count follows the rule.
#[tokio::test]
async fn what_is_carried_is_what_the_old_state_used_then() {
    let h = harness(&lock("gcra"));
    let a = get("/").from("192.0.2.1");
    assert_eq!(h.outcomes(&a, 3).await, ["proceed", "proceed", "proceed"]);
    // One slot of 20 min has drained.
    h.advance(secs(20 * 60));
    h.engine.reload(Rules::parse(&lock("sliding-log"), "t").unwrap());
    assert_eq!(h.outcomes(&a, 1).await, ["proceed"], "two carried, one used since");
    h.engine.reload(Rules::parse(&lock("fixed-window"), "t").unwrap());
    assert_eq!(h.outcomes(&a, 1).await, ["429:lock"], "three carried on");
}

/// Two reloads in a row, through every chain of algorithms (back to the first one too): a key
/// carried under the second rules is carried on from there, one nobody asked for meanwhile is
/// carried from its first state, and neither is counted twice nor forgotten.
#[tokio::test]
async fn reloads_back_and_forth_carry_each_key_once() {
    for a in ALGORITHMS {
        for b in ALGORITHMS.iter().filter(|&&b| b != a) {
            for c in ALGORITHMS {
                let h = harness(&lock(a));
                let (x, y) = (get("/").from("192.0.2.1"), get("/").from("192.0.2.2"));
                assert_eq!(h.outcomes(&x, 2).await, ["proceed", "proceed"]);
                assert_eq!(h.outcomes(&y, 2).await, ["proceed", "proceed"]);
                h.advance(secs(1));
                h.engine.reload(Rules::parse(&lock(b), "t").unwrap());
                // x is touched under b (carried, one more used); y is not.
                assert_eq!(h.outcomes(&x, 1).await, ["proceed"], "{a}->{b}");
                h.advance(secs(1));
                h.engine.reload(Rules::parse(&lock(c), "t").unwrap());
                assert_eq!(h.outcomes(&x, 1).await, ["429:lock"], "{a}->{b}->{c}: x used 3");
                assert_eq!(h.outcomes(&y, 2).await, ["proceed", "429:lock"], "{a}->{b}->{c}: y used 2");
            }
        }
    }
}

/// Envoy's configuration: `user` at `per_hour` requests an hour.
fn shop(per_hour: u32) -> String {
    format!(
        "domain: shop\ndescriptors:\n  - key: user\n    rate_limit: {{ unit: hour, requests_per_unit: {per_hour} }}\n"
    )
}

fn envoy(per_hour: u32) -> tollgate_envoy::Config {
    tollgate_envoy::Config::parse(&shop(per_hour), "shop.yaml").unwrap()
}

/// `user`'s limit and what it has left after one more request of `user`.
async fn user<S: Store>(engine: &Engine<S>, user: &str) -> (u32, u64) {
    let descriptors = [Descriptor { entries: vec![("user", user)], ..Descriptor::default() }];
    match &engine.admit_descriptors("shop", &descriptors, 0).await.unwrap().verdicts[0] {
        Verdict::Limited { limit, decision: Some(decision), .. } => (limit.requests_per_unit, decision.remaining),
        other => panic!("{other:?}"),
    }
}

/// One policy, two sources: reloading Envoy's configuration keeps the rules as they are (their
/// counts, and a carry under way after an algorithm change), reloading the rules keeps Envoy's
/// configuration (and its counts); each reload counts in its own series.
#[tokio::test]
async fn each_source_reloads_on_its_own_and_keeps_the_other() {
    let clock = clock();
    let h = build_tuned(memory(&clock), clock, &lock("gcra"), |b| b.envoy(Arc::new(envoy(3))));
    let a = get("/").from("192.0.2.1");
    assert_eq!(h.outcomes(&a, 2).await, ["proceed", "proceed"]);
    assert_eq!(user(&h.engine, "u").await, (3, 2));
    // The rule's algorithm changes (its keys' use to be carried), then Envoy's part is reloaded.
    h.engine.reload(Rules::parse(&lock("sliding-log"), "t").unwrap());
    h.engine.reload_envoy(envoy(5));
    assert_eq!(user(&h.engine, "u").await, (5, 3), "the new limit, the count kept");
    assert_eq!(h.outcomes(&a, 2).await, ["proceed", "429:lock"], "2 spent before, carried");
    h.engine.reload(Rules::parse(&lock("fixed-window"), "t").unwrap());
    assert_eq!(user(&h.engine, "u").await, (5, 2), "Envoy's part kept");
    assert_eq!(h.series("tollgate_config_reloads_total{result=\"ok\"}"), 2);
    assert_eq!(h.series("tollgate_envoy_config_reloads_total{result=\"ok\"}"), 1);
}

/// Written then renamed in, as deployment tools do.
fn replace(path: &Path, text: &str) {
    let staged = path.with_extension("next");
    std::fs::write(&staged, text).unwrap();
    std::fs::rename(&staged, path).unwrap();
}

/// Waits (at most 10 s) until `done` holds of the metrics.
async fn eventually(registry: &Registry, what: &str, done: impl Fn(&str) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        if done(&text) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {text}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The watcher reloads the file that changed, and only that one; a broken or removed file keeps
/// the policy in force and counts an error; Envoy's reload series exist from the start, at 0.
#[tokio::test]
async fn a_watched_file_is_reloaded_when_it_changes_and_a_broken_one_is_not() {
    let dir = std::env::temp_dir().join(format!("tollgate-engine-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (rules, yaml) = (dir.join("rules.toml"), dir.join("shop.yaml"));
    replace(&rules, &lock("gcra"));
    replace(&yaml, &shop(3));
    let mut registry = Registry::with_prefix("tollgate");
    let engine = Engine::builder(memory(&clock()), Rules::load(&rules).unwrap())
        .envoy(Arc::new(tollgate_envoy::Config::load(&yaml).unwrap()))
        .build(&mut registry);
    let engine = Arc::new(engine);
    let files = vec![PolicyFile::Rules(rules.clone()), PolicyFile::Envoy(yaml.clone())];
    reload::watch(&engine, files, Duration::from_millis(10));
    eventually(&registry, "Envoy's series from the start", |m| {
        m.contains("tollgate_envoy_config_reloads_total{result=\"ok\"} 0\n")
            && m.contains("tollgate_envoy_config_reloads_total{result=\"error\"} 0\n")
    })
    .await;

    replace(&yaml, &shop(7));
    eventually(&registry, "Envoy's file reloaded", |m| m.contains("envoy_config_reloads_total{result=\"ok\"} 1\n"))
        .await;
    assert_eq!(user(&engine, "a").await.0, 7);
    replace(&yaml, "domain: shop\ndescriptors:\n  - key: user\n    rate_limit: { unit: fortnight }\n");
    eventually(&registry, "the broken file tried", |m| m.contains("envoy_config_reloads_total{result=\"error\"} 1\n"))
        .await;
    assert_eq!(user(&engine, "b").await.0, 7, "the configuration in force stays");
    let text = |registry: &Registry| {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        text
    };
    assert!(!text(&registry).contains("tollgate_config_reloads_total{"), "the rules were not reloaded");

    replace(&rules, &lock("fixed-window"));
    eventually(&registry, "the rules reloaded", |m| m.contains("tollgate_config_reloads_total{result=\"ok\"} 1\n"))
        .await;
    assert_eq!(engine.policy().rules.rules[0].limit.algorithm(), tollgate_core::Algorithm::FixedWindow);
    assert!(
        text(&registry).contains("envoy_config_reloads_total{result=\"ok\"} 1\n"),
        "Envoy's file was not reloaded again"
    );
    assert_eq!(user(&engine, "c").await.0, 7);
    // A file removed is a reload that fails: the policy in force stays, and the operator sees it.
    std::fs::remove_file(&yaml).unwrap();
    eventually(&registry, "the removed file tried", |m| m.contains("envoy_config_reloads_total{result=\"error\"} 2\n"))
        .await;
    assert_eq!(user(&engine, "d").await.0, 7);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two reloads of the same file overlapping (SIGHUP's and the watcher's, which since Envoy's
/// configuration joined the engine's reload run in two tasks; before, Envoy's SIGHUP and its poll
/// shared one task): the one that read the file first must not swap its older content in after
/// the one that read the newer content. Here the first reader is made slow by a FIFO (a read
/// that waits for its writer, standing for a large file or a slow disk): it starts reading v1,
/// the file is replaced by v2, the second reload reads v2 and swaps it in, then the first one's
/// read completes with v1. The file says 7 an hour; the policy must say so too.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_reloads_of_a_file_end_with_its_latest_content() {
    use std::io::Write;
    let dir = std::env::temp_dir().join(format!("tollgate-engine-overlap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let yaml = dir.join("shop.yaml");
    let _ = std::fs::remove_file(&yaml);
    let made = std::process::Command::new("mkfifo").arg(&yaml).status().expect("mkfifo");
    assert!(made.success(), "mkfifo {}", yaml.display());
    let mut registry = Registry::with_prefix("tollgate");
    let engine =
        Arc::new(Engine::builder(memory(&clock()), Rules::default()).envoy(Arc::new(envoy(3))).build(&mut registry));

    // The first reload opens the file (the FIFO) and waits on its content.
    let first = {
        let (engine, yaml) = (engine.clone(), yaml.clone());
        std::thread::spawn(move || reload::reload_file(&engine, &PolicyFile::Envoy(yaml)))
    };
    // Opening the FIFO's writing end returns once the first reload has opened its reading end.
    let mut writer = std::fs::OpenOptions::new().write(true).open(&yaml).unwrap();
    // The file is replaced by v2 (renamed in), and a second reload starts: it reads v2 (now,
    // or once the first is done, if reloads of one engine wait for each other).
    replace(&yaml, &shop(7));
    let second = {
        let (engine, yaml) = (engine.clone(), yaml.clone());
        std::thread::spawn(move || reload::reload_file(&engine, &PolicyFile::Envoy(yaml)))
    };
    // Time for the second reload to finish first, if nothing makes it wait (not an assertion).
    let waited = Instant::now();
    while !second.is_finished() && waited.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(10));
    }
    // The first reload's read completes, with what the file held when it began (v1).
    writer.write_all(shop(5).as_bytes()).unwrap();
    drop(writer);
    first.join().unwrap().unwrap();
    second.join().unwrap().unwrap();

    assert_eq!(std::fs::read_to_string(&yaml).unwrap(), shop(7), "the file holds v2");
    assert_eq!(user(&engine, "a").await.0, 7, "the policy in force is the file's latest content, not the stale read");
    let _ = std::fs::remove_dir_all(&dir);
}
