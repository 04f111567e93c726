//! The connection against a real `redis-server`: many callers giving up at random points (before
//! their call is written, between the write and the reply) never receive another call's reply,
//! and a server frozen past every caller's deadline, then thawed, answers the next call with its
//! own reply.

use std::time::Duration;

use tokio::net::TcpStream;

use super::*;
use crate::testkit::redis_server::RedisServer;

/// A small deterministic generator (xorshift): the same callers on every run.
struct Rng(u64);

impl Rng {
    /// A number in `0..n`.
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }

    /// True `percent` times in a hundred.
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

async fn connect(server: &RedisServer) -> (Wire, Tasks) {
    let tcp = TcpStream::connect(("127.0.0.1", server.port())).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let (read, write) = tcp.into_split();
    // Long past any freeze here: these tests are about the replies' order, not stalls.
    Wire::start(read, write, Duration::from_secs(3600))
}

fn echo(text: &str) -> Cmd {
    redis::cmd("ECHO").arg(text).clone()
}

fn text(value: &Value) -> String {
    match value {
        Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        other => format!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_callers_giving_up_at_random_each_get_their_own_reply() {
    let server = RedisServer::start();
    let (wire, _tasks) = connect(&server).await;
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let callers: Vec<_> = (0..10_000u64)
        .map(|i| {
            let wire = wire.clone();
            // A third wait for their reply, the others give up within 0 to 2 ms (some before
            // their call is written, some after); the values are long enough to take a few
            // reads each.
            let patience = (!rng.chance(33)).then(|| Duration::from_micros(rng.below(2_000)));
            let value = format!("call-{i}-{}", "v".repeat(usize::try_from(rng.below(3_000)).unwrap()));
            tokio::spawn(async move {
                let cmd = echo(&value);
                let call = wire.run(&cmd);
                let reply = match patience {
                    None => Some(call.await),
                    Some(patience) => tokio::time::timeout(patience, call).await.ok(),
                };
                match reply {
                    Some(Ok(reply)) => {
                        assert_eq!(text(&reply), value, "a caller received another call's reply");
                        1
                    }
                    Some(Err(error)) => panic!("call-{i}: {error}"),
                    None => 0,
                }
            })
        })
        .collect();
    let mut answered = 0;
    for caller in callers {
        answered += caller.await.unwrap();
    }
    assert!(answered >= 3_000, "{answered} answered");
    assert_eq!(text(&wire.run(&echo("last")).await.unwrap()), "last");
}

#[tokio::test]
async fn a_server_frozen_past_every_deadline_then_thawed_answers_the_next_call_with_its_own_reply() {
    let server = RedisServer::start();
    let (wire, _tasks) = connect(&server).await;
    assert_eq!(text(&wire.run(&echo("before")).await.unwrap()), "before");
    server.freeze();
    let callers: Vec<_> = (0..2_000)
        .map(|i| {
            let wire = wire.clone();
            tokio::spawn(async move {
                let value = format!("frozen-{i}-{}", "x".repeat(200));
                tokio::time::timeout(Duration::from_millis(100), wire.run(&echo(&value))).await.is_err()
            })
        })
        .collect();
    for caller in callers {
        assert!(caller.await.unwrap(), "a frozen server answered");
    }
    server.thaw();
    let next = tokio::time::timeout(Duration::from_secs(10), wire.run(&echo("after"))).await;
    assert_eq!(text(&next.expect("an answer once thawed").unwrap()), "after");
}
