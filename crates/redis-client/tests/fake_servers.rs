//! The client against fake servers whose answers each test scripts (`testkit::fake_redis`): what
//! a broken or hostile server says about the topology (a `CLUSTER SLOTS` past every bound, a
//! Sentinel naming an address that is none), what a failed call says it may have done
//! ([`Delivery`]: what exactly-once charging rests on), and a script's native command falling
//! back to the script. The store's own fake-server tests (`crates/store/tests/redis_replies.rs`)
//! cover the rest through a store.

use std::io::{Read, Write};
use std::time::Duration;

use tollgate_redis_client::testkit::fake_redis::{self, Answer, FakeRedis, is, resp};
use tollgate_redis_client::{CallError, Connection, Delivery, Native, RedisTarget, Script};

const TIMEOUT: Duration = Duration::from_secs(2);

fn connect(url: &str) -> Connection {
    Connection::open(&RedisTarget::parse(url).unwrap(), TIMEOUT).unwrap()
}

fn ping() -> redis::Cmd {
    redis::cmd("PING")
}

/// Runs `PING` on `connection`, within 10 s.
async fn run(connection: &Connection) -> Result<redis::Value, CallError> {
    tokio::time::timeout(Duration::from_secs(10), connection.run(b"k", &ping(), None))
        .await
        .expect("a call ended within 10 s")
}

/// A cluster node owning every slot, answering `PING`.
fn whole_cluster() -> FakeRedis {
    let node = FakeRedis::start(|_| Answer::Silent);
    let port = node.port();
    node.script(move |command| {
        if is(command, &["CLUSTER", "SLOTS"]) {
            fake_redis::cluster_slots(&[(0, 16_383, port)])
        } else {
            Answer::Raw(resp::simple("PONG"))
        }
    });
    node
}

/// `CLUSTER SLOTS` answers past every bound: more ranges than slots, an array announcing more
/// values than one reply may hold, and one that never ends. Each is refused (no call goes to a
/// node it names, and none of the call's is sent: [`Delivery::NotSent`]); a seed with a sound
/// map is used meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_cluster_slots_answers_are_refused_and_a_sound_seed_used() {
    let too_many_ranges = {
        let range = resp::array(&[
            resp::int(0),
            resp::int(0),
            resp::array(&[resp::bulk("127.0.0.1"), resp::int(1), resp::bulk("id")]),
        ]);
        let mut reply = format!("*{}\r\n", 16_385).into_bytes();
        for _ in 0..16_385 {
            reply.extend_from_slice(&range);
        }
        Answer::Raw(reply)
    };
    let hostile = [
        ("more ranges than slots", too_many_ranges, "16385 ranges for 16384 slots"),
        ("too many values", Answer::Raw(b"*2147483647\r\n".to_vec()), "2147483647 values in one reply"),
        (
            "endless",
            Answer::Endless { head: b"*1\r\n*3\r\n:0\r\n:16383\r\n+".to_vec(), chunk: vec![b'x'; 1 << 16] },
            "a reply of more than",
        ),
    ];
    for (what, answer, said) in hostile {
        let liar = FakeRedis::start(move |command| {
            if is(command, &["CLUSTER", "SLOTS"]) { answer.clone() } else { Answer::Raw(resp::simple("PONG")) }
        });
        // Alone: the call fails unsent, and the probe says why.
        let alone = connect(&format!("redis+cluster://{}", liar.address()));
        let error = run(&alone).await.unwrap_err();
        assert_eq!(error.delivery(), Delivery::NotSent, "{what}: {error}");
        let probe = tokio::time::timeout(Duration::from_secs(10), alone.probe()).await.unwrap().unwrap_err();
        assert!(probe.to_string().contains(said), "{what}: {probe}");
        assert_eq!(liar.count(&["PING"]), 0, "{what}: a call went to a node of a refused map");
        // With a sound seed: its map is used, whatever the liar says.
        let sound = whole_cluster();
        let both = connect(&format!("redis+cluster://{},{}", liar.address(), sound.address()));
        assert_eq!(run(&both).await.unwrap(), redis::Value::SimpleString("PONG".into()), "{what}");
        assert_eq!(sound.count(&["PING"]), 1, "{what}");
    }
}

/// A Sentinel naming, as the primary, an address that is none (a port of 0, past 65,535 or not a
/// number; a host with a space or a slash): no connection is attempted there, the call fails
/// unsent with the answer named, and a Sentinel naming a sound primary is followed meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_naming_an_address_that_is_none_is_not_followed() {
    let primary = FakeRedis::start(|command| {
        if is(command, &["ROLE"]) { fake_redis::role("master") } else { Answer::Raw(resp::simple("PONG")) }
    });
    let sound_port = primary.port().to_string();
    let sound = FakeRedis::start(move |command| {
        if is(command, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME"]) {
            Answer::Raw(resp::array(&[resp::bulk("127.0.0.1"), resp::bulk(&sound_port)]))
        } else {
            Answer::Raw(resp::error("ERR unknown command"))
        }
    });
    for (host, port, said) in [
        ("127.0.0.1", "0", "port 0 is not a port"),
        ("127.0.0.1", "65536", "port 65536 is not a port"),
        ("127.0.0.1", "x", "a port that is not a number"),
        ("a b", "6379", "is not a host"),
        ("h/x@y", "6379", "is not a host"),
    ] {
        let liar = FakeRedis::start(move |command| {
            if is(command, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME"]) {
                Answer::Raw(resp::array(&[resp::bulk(host), resp::bulk(port)]))
            } else {
                Answer::Raw(resp::error("ERR unknown command"))
            }
        });
        let alone = connect(&format!("redis+sentinel://{}/tollgate", liar.address()));
        let error = run(&alone).await.unwrap_err();
        assert_eq!(error.delivery(), Delivery::NotSent, "{host}:{port}: {error}");
        assert!(error.to_string().contains("an impossible answer") && error.to_string().contains(said), "{error}");
        let before = primary.count(&["PING"]);
        let both = connect(&format!("redis+sentinel://{},{}/tollgate", liar.address(), sound.address()));
        assert_eq!(run(&both).await.unwrap(), redis::Value::SimpleString("PONG".into()), "{host}:{port}");
        assert_eq!(primary.count(&["PING"]), before + 1);
    }
}

/// What a failed call says it may have done: answered by the server with an error; not sent when
/// its connection could not be made (a password refused) or no server is known for it; may have
/// run when its connection ended between its write and its reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_call_says_what_it_may_have_done() {
    let refusing = FakeRedis::start(|_| Answer::Raw(resp::error("ERR no such command here")));
    let error = run(&connect(&format!("redis://{}", refusing.address()))).await.unwrap_err();
    assert_eq!(error.delivery(), Delivery::Answered, "{error}");
    assert_eq!(error.server().map(ToString::to_string), Some(refusing.address()));

    let locked = FakeRedis::start(|command| {
        if is(command, &["AUTH"]) {
            Answer::Raw(resp::error("WRONGPASS invalid username-password pair"))
        } else {
            Answer::Raw(resp::simple("PONG"))
        }
    });
    let error = run(&connect(&format!("redis://:secret@{}", locked.address()))).await.unwrap_err();
    assert_eq!(error.delivery(), Delivery::NotSent, "{error}");
    assert!(error.to_string().contains("authentication failed") && !error.to_string().contains("secret"), "{error}");
    assert_eq!(locked.count(&["PING"]), 0);

    let nameless = FakeRedis::start(|_| Answer::Raw(resp::nil()));
    let error = run(&connect(&format!("redis+sentinel://{}/tollgate", nameless.address()))).await.unwrap_err();
    assert_eq!((error.delivery(), error.server()), (Delivery::NotSent, None), "{error}");

    // A server that reads the call, then closes the connection without a word.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for socket in listener.incoming() {
            let Ok(mut socket) = socket else { return };
            std::thread::spawn(move || {
                let mut seen = Vec::new();
                let mut chunk = [0u8; 256];
                while !seen.windows(4).any(|w| w == b"PING") {
                    match socket.read(&mut chunk) {
                        Ok(n @ 1..) => seen.extend_from_slice(&chunk[..n]),
                        _ => return,
                    }
                }
                let _ = socket.flush();
                let _ = socket.shutdown(std::net::Shutdown::Both);
            });
        }
    });
    let error = run(&connect(&format!("redis://127.0.0.1:{port}"))).await.unwrap_err();
    assert_eq!(error.delivery(), Delivery::MayHaveRun, "{error}");
    assert!(error.to_string().contains("may have run"), "{error}");
}

/// A script's native command is used where the server has it; where it does not (an unknown
/// command, or a refusal its [`Native::refusals`] name), its calls go to the script's function,
/// loaded where missing, and the server is not asked the native command again; any other error
/// of the native command is the call's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_native_command_falls_back_to_the_script_only_where_it_is_missing() {
    const NATIVE: Native = Native { command: "LIB.CHECK", refusals: &["LIB_VERSION"] };
    let script =
        Script::new("#!lua name=lib\nredis.register_function('lib_f', f)".into(), "lib_f".into(), "return 1".into())
            .with_native(NATIVE);
    let call = redis::cmd("LIB.CHECK").arg("k").arg("a").clone();
    for (native_answer, falls_back) in [
        (resp::error("ERR unknown command 'LIB.CHECK'"), true),
        (resp::error("LIB_VERSION the module reads layout 9"), true),
        (resp::error("ERR something else"), false),
        (resp::int(7), false),
    ] {
        let loaded = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let server = FakeRedis::start({
            let loaded = loaded.clone();
            let native_answer = native_answer.clone();
            move |command| {
                if is(command, &["LIB.CHECK"]) {
                    Answer::Raw(native_answer.clone())
                } else if is(command, &["FUNCTION", "LOAD"]) {
                    loaded.store(true, std::sync::atomic::Ordering::Relaxed);
                    Answer::Raw(resp::bulk("lib"))
                } else if is(command, &["FCALL", "lib_f", "1", "k", "a"]) {
                    if loaded.load(std::sync::atomic::Ordering::Relaxed) {
                        Answer::Raw(resp::int(1))
                    } else {
                        Answer::Raw(resp::error("ERR Function not found"))
                    }
                } else {
                    Answer::Raw(resp::error("ERR unexpected"))
                }
            }
        });
        let connection = connect(&format!("redis://{}", server.address()));
        for _ in 0..2 {
            let reply = connection.run(b"k", &call, Some(&script)).await;
            match (falls_back, &native_answer[..1]) {
                (true, _) => assert_eq!(reply.unwrap(), redis::Value::Int(1)),
                (false, b":") => assert_eq!(reply.unwrap(), redis::Value::Int(7)),
                (false, _) => assert_eq!(reply.unwrap_err().delivery(), Delivery::Answered),
            }
        }
        let asked_native = server.count(&["LIB.CHECK"]);
        assert_eq!(asked_native, if falls_back { 1 } else { 2 }, "{:?}", String::from_utf8_lossy(&native_answer));
        assert_eq!(server.count(&["FUNCTION", "LOAD"]), usize::from(falls_back));
    }
}
