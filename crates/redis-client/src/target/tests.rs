//! The URL forms, every mistake named, and TLS files checked.

use super::*;

fn address(host: &str, port: u16) -> Address {
    Address { host: host.into(), port }
}

#[test]
fn every_form_parses() {
    let t = RedisTarget::parse("redis://127.0.0.1:6379").unwrap();
    assert_eq!(t.topology, Topology::Server(address("127.0.0.1", 6379)));
    assert!(t.tls.is_none() && t.username.is_none() && t.db == 0);
    let t = RedisTarget::parse("rediss://tg:p%40ss%3Aword@[::1]:6380/3").unwrap();
    assert_eq!(t.topology, Topology::Server(address("::1", 6380)));
    assert_eq!((t.username.as_deref(), t.password.as_deref(), t.db), (Some("tg"), Some("p@ss:word"), 3));
    assert!(t.tls.is_some());
    let t = RedisTarget::parse("redis://:secret@h").unwrap();
    assert_eq!((t.username, t.password.as_deref()), (None, Some("secret")));
    let t = RedisTarget::parse("rediss+cluster://u:p@a:1, b:2").unwrap();
    assert_eq!(t.topology, Topology::Cluster(vec![address("a", 1), address("b", 2)]));
    let t = RedisTarget::parse("redis+sentinel://s1,s2:26380/my%20master/4").unwrap();
    assert_eq!(
        t.topology,
        Topology::Sentinel { sentinels: vec![address("s1", 26379), address("s2", 26380)], master: "my master".into() }
    );
    assert_eq!(t.db, 4);
}

#[test]
fn every_mistake_is_named_with_an_example() {
    for (url, wanted) in [
        ("redis://", "the host: it is missing"),
        ("redis://:6379", "the host: it is missing"),
        ("redis://:pw@", "the host: it is missing"),
        ("http://h:1", "the scheme is none of redis"),
        ("h:1", "does not start with a scheme"),
        ("redis://h:99999", "the host: its port is not a number from 1 to 65535"),
        ("redis://h:0", "its port is not a number"),
        ("redis://[::1]x", "something other than :PORT"),
        ("redis://h x:1", "not a host name"),
        ("redis://h:1/x", "the database (after the hosts' '/') is not a number"),
        ("redis://h:1/?protocol=resp3", "options"),
        ("rediss://h:1/#insecure", "always verified"),
        ("redis://a:1,b:2", "several hosts"),
        ("redis+cluster://", "the host: it is missing"),
        ("redis+cluster://a:1,b:x", "host 2 of 2: its port"),
        ("redis+cluster://a:1/3", "only database 0"),
        ("redis+sentinel://a:1", "no master name"),
        ("redis+sentinel://a:1/m/x", "the database"),
        ("redis://user@h", "a user without a password"),
        ("redis://user:@h", "a user without a password"),
        ("redis://:%FF@h", "not UTF-8"),
    ] {
        let error = RedisTarget::parse(url).unwrap_err();
        assert!(error.contains(wanted) && error.contains("e.g. redis://127.0.0.1:6379"), "{url}: {error}");
    }
}

#[test]
fn credentials_never_reach_a_message() {
    assert_eq!(redacted("redis://user:secret@h:1/2"), "redis://user@h:1/2");
    assert_eq!(redacted("redis+cluster://:s@a:1,b:2"), "redis+cluster://a:1,b:2");
    assert_eq!(redacted("redis://:secret@h:1/x"), "redis://…");
    assert_eq!(redacted("redis://h:1/0?password=secret"), "redis://…");
    assert_eq!(redacted("mongodb://u:secret@h"), "…");
    let error = RedisTarget::parse("redis://:secret@h:1/x").unwrap_err();
    assert!(!error.contains("secret"), "{error}");
    let t = RedisTarget::parse("rediss+sentinel://u:secret@a:1,b:2/m/1").unwrap();
    assert_eq!(t.redacted(), "rediss+sentinel://u@a:1,b:2/m/1");
    let t = RedisTarget::parse("redis+sentinel://u%40x:secret@a/my%2Fmaster").unwrap();
    assert_eq!(t.redacted(), "redis+sentinel://u%40x@a:26379/my%2Fmaster");
    assert!(!format!("{t:?}").contains("client_key"));
}

#[test]
fn tls_files_are_checked() {
    let dir = std::env::temp_dir().join(format!("tollgate-target-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let empty = dir.join("empty.pem");
    std::fs::write(&empty, "").unwrap();
    let error = TlsConfig::from_files(Some(&empty), None, None).unwrap_err();
    assert!(error.contains("holds no certificate"), "{error}");
    let error = TlsConfig::from_files(None, Some(&empty), None).unwrap_err();
    assert!(error.contains("go together"), "{error}");
    let error = TlsConfig::from_files(Some(&dir.join("missing.pem")), None, None).unwrap_err();
    assert!(error.contains("cannot read"), "{error}");
    assert_eq!(TlsConfig::default().trusted(), "the system's root certificates");
    let _ = std::fs::remove_dir_all(&dir);
}

/// No credential of the URL corpus reaches a message of this crate: not [`redacted`], not a
/// parse error, not the `Debug` of a target or of the settings made from it (the store checks
/// its own configuration and store with the same corpus).
#[cfg(feature = "testkit")]
#[test]
fn no_credential_reaches_a_message() {
    use crate::node::Settings;
    use crate::testkit::urls::{CORPUS, Expected, Leaks, TOKENS};
    use std::time::Duration;
    let mut leaks = Leaks::default();
    for (url, expected) in CORPUS {
        assert!(TOKENS.iter().any(|t| url.contains(t)), "{url} holds no token");
        leaks.check(url, "redacted()", &redacted(url));
        match (RedisTarget::parse(url), expected) {
            (Ok(mut target), Expected::Password(password)) => {
                if target.password.as_deref() != Some(*password) {
                    leaks.misread(url, format!("the password read is not {password:?}"));
                }
                leaks.check(url, "RedisTarget::redacted()", &target.redacted());
                target.sentinel_username = Some("sentinel-user".into());
                target.sentinel_password = Some("kp4/nb8".into());
                leaks.check(url, "Debug of RedisTarget", &format!("{target:?}"));
                let settings = Settings::data(&target, Duration::from_millis(50));
                leaks.check(url, "Debug of the data servers' Settings", &format!("{settings:?}"));
                let settings = Settings::sentinels(&target, Duration::from_millis(50));
                leaks.check(url, "Debug of the Sentinels' Settings", &format!("{settings:?}"));
            }
            (Err(error), Expected::Refused) => leaks.check(url, "RedisTarget::parse's error", &error),
            (Ok(target), Expected::Refused) => {
                leaks.misread(url, format!("parsed as {}, wanted an error", target.redacted()));
            }
            (Err(error), Expected::Password(_)) => leaks.misread(url, format!("refused, wanted a password: {error}")),
        }
    }
    leaks.none();
}
