//! A fake Redis server on a loopback port whose answers a test scripts (feature `testkit`): what a real server sends only when it is broken, compromised or being replaced (a
//! `CLUSTER SLOTS` of no slots, `-MOVED 20000 …`, a `ROLE` of `slave` for a server the Sentinels
//! name, a Sentinel naming another server, a server that never answers, a reply that never ends).
//!
//! It runs on threads of its own (blocking sockets), so it serves whatever runtime the test uses.
//! Every command it receives is recorded, so a test can count what the client asked and where.
//! Stopped on drop (connections already open stay until their client closes them).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// What the fake answers to one command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// These bytes (RESP, see [`resp`]).
    Raw(Vec<u8>),
    /// Nothing, ever: the connection stays open, as a frozen server's or a black hole's.
    Silent,
    /// A reply that never ends: `head`, then `chunk` again and again, as fast as the client
    /// reads, until it hangs up (counted in [`FakeRedis::streamed`]).
    Endless {
        /// The start of the reply (`$9999999999\r\n`, `*2147483647\r\n`, `+`).
        head: Vec<u8>,
        /// What follows, forever.
        chunk: Vec<u8>,
    },
}

type Script = Box<dyn Fn(&[Vec<u8>]) -> Answer + Send + Sync>;

/// What the listener and its connections share.
struct Shared {
    script: Mutex<Script>,
    received: Mutex<Vec<Vec<Vec<u8>>>>,
    stopped: AtomicBool,
    /// Bytes sent in endless replies, and how many of those the client ended by hanging up.
    streamed: AtomicU64,
    hung_up: AtomicU64,
}

/// A fake Redis server (see the module docs).
pub struct FakeRedis {
    port: u16,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for FakeRedis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FakeRedis(127.0.0.1:{})", self.port)
    }
}

impl FakeRedis {
    /// Listens on a free loopback port and answers each command (its arguments, the command's
    /// name first) as `script` says.
    #[must_use]
    pub fn start(script: impl Fn(&[Vec<u8>]) -> Answer + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let port = listener.local_addr().expect("its address").port();
        let shared = Arc::new(Shared {
            script: Mutex::new(Box::new(script)),
            received: Mutex::new(Vec::new()),
            stopped: AtomicBool::new(false),
            streamed: AtomicU64::new(0),
            hung_up: AtomicU64::new(0),
        });
        let accepting = shared.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if accepting.stopped.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                let connection = accepting.clone();
                std::thread::spawn(move || serve(stream, &connection));
            }
        });
        FakeRedis { port, shared }
    }

    /// A server that accepts connections and reads every command, but never answers one.
    #[must_use]
    pub fn silent() -> Self {
        FakeRedis::start(|_| Answer::Silent)
    }

    /// Answers as `script` says from now on.
    pub fn script(&self, script: impl Fn(&[Vec<u8>]) -> Answer + Send + Sync + 'static) {
        *self.shared.script.lock().unwrap_or_else(PoisonError::into_inner) = Box::new(script);
    }

    /// Its port.
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:PORT`.
    #[must_use]
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Bytes sent so far in endless replies ([`Answer::Endless`]), and how many of those ended
    /// because the client hung up.
    #[must_use]
    pub fn streamed(&self) -> (u64, u64) {
        (self.shared.streamed.load(Ordering::Relaxed), self.shared.hung_up.load(Ordering::Relaxed))
    }

    /// Every command received so far, in order.
    #[must_use]
    pub fn received(&self) -> Vec<Vec<Vec<u8>>> {
        self.shared.received.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// How many commands received so far start with `words` (case-insensitive), e.g.
    /// `["CLUSTER", "SLOTS"]` or `["FCALL"]`.
    #[must_use]
    pub fn count(&self, words: &[&str]) -> usize {
        self.shared.received.lock().unwrap_or_else(PoisonError::into_inner).iter().filter(|c| is(c, words)).count()
    }
}

impl Drop for FakeRedis {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::Relaxed);
        // Wakes the listener's thread, which sees the flag and ends.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Reads commands from `stream` and answers them, until the client closes it.
fn serve(mut stream: TcpStream, shared: &Shared) {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        while let Some((command, used)) = parse_command(&buffer) {
            buffer.drain(..used);
            shared.received.lock().unwrap_or_else(PoisonError::into_inner).push(command.clone());
            let answer = (shared.script.lock().unwrap_or_else(PoisonError::into_inner))(&command);
            match answer {
                Answer::Raw(bytes) if stream.write_all(&bytes).is_err() => return,
                Answer::Raw(_) | Answer::Silent => {}
                Answer::Endless { head, chunk } => {
                    let mut sent = stream.write_all(&head);
                    while sent.is_ok() && !shared.stopped.load(Ordering::Relaxed) {
                        shared.streamed.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                        sent = stream.write_all(&chunk);
                    }
                    if sent.is_err() {
                        shared.hung_up.fetch_add(1, Ordering::Relaxed);
                    }
                    return;
                }
            }
        }
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
        }
    }
}

/// One command (`*N` then `N` bulk strings, as every client sends) at the start of `bytes`, and
/// the bytes it took; `None` until it is complete.
fn parse_command(bytes: &[u8]) -> Option<(Vec<Vec<u8>>, usize)> {
    fn line(bytes: &[u8], from: usize) -> Option<(&[u8], usize)> {
        let end = bytes.get(from..)?.windows(2).position(|w| w == b"\r\n")? + from;
        Some((&bytes[from..end], end + 2))
    }
    let number = |text: &[u8]| std::str::from_utf8(text).ok()?.parse::<usize>().ok();
    let (head, mut at) = line(bytes, 0)?;
    let count = number(head.strip_prefix(b"*")?)?;
    let mut args = Vec::with_capacity(count.min(64));
    for _ in 0..count {
        let (head, start) = line(bytes, at)?;
        let len = number(head.strip_prefix(b"$")?)?;
        let arg = bytes.get(start..start.checked_add(len)?)?;
        args.push(arg.to_vec());
        at = start + len + 2;
        if bytes.len() < at {
            return None;
        }
    }
    Some((args, at))
}

/// RESP values, for scripts.
pub mod resp {
    /// `:n`
    #[must_use]
    pub fn int(n: i64) -> Vec<u8> {
        format!(":{n}\r\n").into_bytes()
    }

    /// A bulk string.
    #[must_use]
    pub fn bulk(text: &str) -> Vec<u8> {
        format!("${}\r\n{text}\r\n", text.len()).into_bytes()
    }

    /// `+text`
    #[must_use]
    pub fn simple(text: &str) -> Vec<u8> {
        format!("+{text}\r\n").into_bytes()
    }

    /// `-text` (an error reply: `MOVED 20000 127.0.0.1:1`, `READONLY …`).
    #[must_use]
    pub fn error(text: &str) -> Vec<u8> {
        format!("-{text}\r\n").into_bytes()
    }

    /// The nil bulk string.
    #[must_use]
    pub fn nil() -> Vec<u8> {
        b"$-1\r\n".to_vec()
    }

    /// An array of values.
    #[must_use]
    pub fn array(items: &[Vec<u8>]) -> Vec<u8> {
        let mut out = format!("*{}\r\n", items.len()).into_bytes();
        for item in items {
            out.extend_from_slice(item);
        }
        out
    }
}

/// `CLUSTER SLOTS`' answer: each range (first slot, last slot) served by the primary on
/// 127.0.0.1 at its port (no replicas).
#[must_use]
pub fn cluster_slots(ranges: &[(u16, u16, u16)]) -> Answer {
    let range = |&(start, end, port): &(u16, u16, u16)| {
        let primary = resp::array(&[resp::bulk("127.0.0.1"), resp::int(i64::from(port)), resp::bulk("id")]);
        resp::array(&[resp::int(i64::from(start)), resp::int(i64::from(end)), primary])
    };
    Answer::Raw(resp::array(&ranges.iter().map(range).collect::<Vec<_>>()))
}

/// `ROLE`'s answer: `master` or `slave`.
#[must_use]
pub fn role(role: &str) -> Answer {
    Answer::Raw(match role {
        "master" => resp::array(&[resp::bulk("master"), resp::int(0), resp::array(&[])]),
        other => resp::array(&[
            resp::bulk(other),
            resp::bulk("127.0.0.1"),
            resp::int(1),
            resp::bulk("connected"),
            resp::int(0),
        ]),
    })
}

/// Whether `command` is `words` (case-insensitive), e.g. `["CLUSTER", "SLOTS"]`.
#[must_use]
pub fn is(command: &[Vec<u8>], words: &[&str]) -> bool {
    command.len() >= words.len() && words.iter().zip(command).all(|(w, a)| a.eq_ignore_ascii_case(w.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_framed_whole_or_not_at_all() {
        let bytes = b"*2\r\n$7\r\nCLUSTER\r\n$5\r\nSLOTS\r\n*1\r\n$4\r\nPING\r\n";
        let (command, used) = parse_command(bytes).unwrap();
        assert_eq!(command, [b"CLUSTER".to_vec(), b"SLOTS".to_vec()]);
        assert_eq!(parse_command(&bytes[used..]).unwrap().0, [b"PING".to_vec()]);
        for cut in 0..used {
            assert!(parse_command(&bytes[..cut]).is_none(), "{cut}");
        }
    }
}
