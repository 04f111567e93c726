//! Review of issue 37's reply reader (`reply.rs`, the workspace's RESP reader in front of the
//! driver's): a connection against a server whose replies are odd or hostile, arriving byte by
//! byte or together with what follows them. Each call ends with the value the driver reads, or
//! with an error; a reply the client received whole is given to its call.

use std::io::{Read, Write};
use std::time::Duration;

use tollgate_redis_client::{Connection, RedisTarget};

/// A server answering every `PING` with `reply`, written `split` bytes at a time (0: at once),
/// followed by `after` in the same write as the reply's last bytes.
fn serve(reply: &'static [u8], split: usize, after: &'static [u8]) -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for socket in listener.incoming() {
            let Ok(mut socket) = socket else { return };
            socket.set_nodelay(true).unwrap();
            std::thread::spawn(move || {
                let mut seen = Vec::new();
                let mut chunk = [0u8; 256];
                let mut answered = 0;
                loop {
                    let pings = seen.windows(4).filter(|w| w == b"PING").count();
                    while answered < pings {
                        answered += 1;
                        let mut whole = reply.to_vec();
                        whole.extend_from_slice(after);
                        if split == 0 {
                            if socket.write_all(&whole).is_err() {
                                return;
                            }
                        } else {
                            let (head, tail) = whole.split_at(reply.len().saturating_sub(1));
                            for piece in head.chunks(split) {
                                if socket.write_all(piece).is_err() {
                                    return;
                                }
                                let _ = socket.flush();
                                std::thread::sleep(Duration::from_millis(2));
                            }
                            if socket.write_all(tail).is_err() {
                                return;
                            }
                        }
                    }
                    match socket.read(&mut chunk) {
                        Ok(n @ 1..) => seen.extend_from_slice(&chunk[..n]),
                        _ => return,
                    }
                }
            });
        }
    });
    port
}

async fn ping(port: u16) -> Result<redis::Value, String> {
    let target = RedisTarget::parse(&format!("redis://127.0.0.1:{port}")).unwrap();
    let connection = Connection::open(&target, Duration::from_secs(2)).unwrap();
    tokio::time::timeout(Duration::from_secs(10), connection.run(b"k", &redis::cmd("PING"), None))
        .await
        .expect("a call ended within 10 s")
        .map_err(|e| e.to_string())
}

/// Odd replies, whole and byte by byte: each reads as the driver reads it, or is an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_replies_read_as_the_driver_reads_them_however_they_arrive() {
    let cases: &[&'static [u8]] = &[
        b"*2\r\n:1\r\n$3\r\nabc\r\n",
        b":+5\r\n",
        b": 5\r\n",
        b"$-2\r\n",
        b"*-5\r\n",
        b"_\r\n",
        b",1.5\r\n",
        b"#t\r\n",
        b"*3\r\n:1\r\n+OK\r\n$-1\r\n",
        b"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:7\r\n",
        b":99999999999999999999\r\n",
        b"$3\r\nabcXY",
        b"$9999999999\r\n",
    ];
    for &reply in cases {
        let expected = redis::parse_redis_value(reply).map_err(|e| e.to_string());
        for split in [0, 1] {
            let read = ping(serve(reply, split, b"")).await;
            match (&expected, &read) {
                (Ok(a), Ok(b)) => assert_eq!(a, b, "{:?} split {split}", String::from_utf8_lossy(reply)),
                (Err(_), Err(_)) => {}
                _ => panic!(
                    "{:?} split {split}: read {read:?}, the driver reads {expected:?}",
                    String::from_utf8_lossy(reply)
                ),
            }
        }
    }
}

/// A reply received whole, followed in the same read by bytes that are not RESP (a broken or
/// hostile server): the call it answers gets it (the garbage ends the connection, as a reply no
/// call awaits does), not an error saying it may have run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_reply_followed_by_garbage_is_given_to_its_call() {
    let mut lost = Vec::new();
    for after in [b"!garbage\r\n".as_slice(), b":notanumber\r\n", b"?\r\n"] {
        let read = ping(serve(b":1\r\n", 0, after)).await;
        if read != Ok(redis::Value::Int(1)) {
            lost.push(format!("followed by {:?}: {read:?}", String::from_utf8_lossy(after)));
        }
    }
    assert!(lost.is_empty(), "a whole reply (:1) lost to what followed it: {lost:#?}");
}

/// Replies generated from RESP's pieces and their odd forms (a fixed seed): the fuzz body
/// (`fuzzing::redis_topology`) reads each with the framing, then each framed reply with the
/// connection's reader and with the driver's parser, which must agree.
#[test]
fn generated_replies_read_as_the_driver_reads_them() {
    const PIECES: &[&[u8]] = &[
        b":1\r\n",
        b":+5\r\n",
        b":-0\r\n",
        b": 5\r\n",
        b":9223372036854775808\r\n",
        b":\r\n",
        b"$0\r\n\r\n",
        b"$3\r\nabc\r\n",
        b"$+3\r\nabc\r\n",
        b"$-1\r\n",
        b"$-7\r\n",
        b"$3\r\nab\r\n\r\n",
        b"$1\r\n\r\r\n",
        b"*0\r\n",
        b"*-1\r\n",
        b"*-3\r\n",
        b"*+1\r\n",
        b"*1\r\n",
        b"*2\r\n",
        b"*3\r\n",
        b"+OK\r\n",
        b"-ERR x\r\n",
        b"_\r\n",
        b",1.5\r\n",
        b"#f\r\n",
        b"%1\r\n",
        b"~1\r\n",
        b">1\r\n",
        b"(12\r\n",
        b"=5\r\ntxt:a\r\n",
        b"\r\n",
    ];
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..200_000 {
        let mut input = Vec::new();
        for _ in 0..1 + next() % 8 {
            input.extend_from_slice(PIECES[usize::try_from(next() % PIECES.len() as u64).unwrap()]);
        }
        tollgate_redis_client::fuzzing::redis_topology(&input);
    }
}

/// A server that closes its connection part way through a reply (split byte by byte or not): the
/// call ends with an error saying it may have run, within the bound, and a call on a new
/// connection to a sound server is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_cut_short_by_a_closed_connection_is_an_error() {
    for cut in [b"*2\r\n:1\r\n".as_slice(), b"$9999999999\r\nabc", b"*2147483647\r\n:1\r\n", b"$3\r\nab", b":12"] {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let Ok((mut socket, _)) = listener.accept() else { return };
            let mut seen = Vec::new();
            let mut chunk = [0u8; 256];
            while !seen.windows(4).any(|w| w == b"PING") {
                match socket.read(&mut chunk) {
                    Ok(n @ 1..) => seen.extend_from_slice(&chunk[..n]),
                    _ => return,
                }
            }
            for byte in cut {
                let _ = socket.write_all(std::slice::from_ref(byte));
            }
            let _ = socket.shutdown(std::net::Shutdown::Both);
        });
        let read = ping(port).await;
        assert!(
            read.as_ref().is_err_and(|e| e.contains("may have run")),
            "{:?}: {read:?}",
            String::from_utf8_lossy(cut)
        );
    }
    assert_eq!(ping(serve(b"+PONG\r\n", 1, b"")).await, Ok(redis::Value::SimpleString("PONG".into())));
}
