//! The RESP target: any command (`CL.THROTTLE {key} 15 30 60 1`, `TG.CHECK …`, or plain Redis
//! `INCR {key}`), pipelined `-P` deep on each connection, with a reply reader that knows
//! whether a reply is a rate-limit decision.
//!
//! One task per connection writes every due request it may (up to the pipeline depth) in one
//! write, then reads replies; replies come back in order, so the oldest request in flight owns
//! the next reply.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::keys::{Keys, Rng, Template};
use super::record::{Answer, Failure, Recorder, Shared, Tally};
use super::schedule::{Schedule, Ticket};

/// A reply larger than this breaks the connection rather than growing the buffer without end.
const MAX_REPLY_BYTES: usize = 64 << 20;
/// Deepest nesting of arrays in a reply.
const MAX_DEPTH: usize = 16;
/// How long a connection waits before trying again after it could not connect.
const RECONNECT_PAUSE: Duration = Duration::from_millis(50);

/// How a command's reply says whether the request was admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReplyKind {
    /// `CL.THROTTLE`: `[limited 0/1, …]`.
    Throttle,
    /// `TG.CHECK`, `TG.PEEK`, `TG.LIMIT`: `[allowed 1/0, …]`.
    Check,
    /// Anything else: not a decision.
    Plain,
}

/// The command each request sends.
#[derive(Debug, Clone)]
pub(crate) struct Command {
    args: Vec<Template>,
    pub(crate) kind: ReplyKind,
}

impl Command {
    /// Parses a command line as redis-cli does: words split on spaces, `"…"` or `'…'` quoting
    /// a word with spaces.
    pub(crate) fn parse(line: &str) -> Result<Command, String> {
        let words = split_words(line)?;
        let Some(name) = words.first() else {
            return Err("--command is empty (e.g. --command \"CL.THROTTLE {key} 15 30 60 1\")".into());
        };
        let kind = match name.to_ascii_uppercase().as_str() {
            "CL.THROTTLE" => ReplyKind::Throttle,
            "TG.CHECK" | "TG.PEEK" | "TG.LIMIT" => ReplyKind::Check,
            _ => ReplyKind::Plain,
        };
        Ok(Command { args: words.iter().map(|w| Template::new(w)).collect(), kind })
    }

    pub(crate) fn has_key(&self) -> bool {
        self.args.iter().any(Template::has_key)
    }

    /// Appends the command for `key` in RESP's array-of-bulk-strings form.
    fn encode(&self, key: &[u8], out: &mut Vec<u8>) {
        out.extend_from_slice(format!("*{}\r\n", self.args.len()).as_bytes());
        for arg in &self.args {
            out.extend_from_slice(format!("${}\r\n", arg.rendered_len(key)).as_bytes());
            arg.render_into(key, out);
            out.extend_from_slice(b"\r\n");
        }
    }

    /// What a parsed reply means for this command.
    fn answer(&self, reply: Reply) -> Result<Answer, Failure> {
        match (reply, self.kind) {
            (Reply::Error(text), _) => Err(Failure::Reply(text)),
            (Reply::Value { first: Some(0) }, ReplyKind::Throttle)
            | (Reply::Value { first: Some(1) }, ReplyKind::Check) => Ok(Answer::Allowed),
            (Reply::Value { first: Some(1) }, ReplyKind::Throttle)
            | (Reply::Value { first: Some(0) }, ReplyKind::Check) => Ok(Answer::Denied),
            (Reply::Value { .. }, _) => Ok(Answer::Other),
        }
    }
}

fn split_words(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let Some(&first) = chars.peek() else { return Ok(words) };
        let mut word = String::new();
        if first == '"' || first == '\'' {
            chars.next();
            loop {
                match chars.next() {
                    Some(c) if c == first => break,
                    Some(c) => word.push(c),
                    None => return Err(format!("unbalanced {first} in --command {line:?}")),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                word.push(c);
            }
        }
        words.push(word);
    }
}

/// A reply, as far as the load generator cares.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Reply {
    Error(String),
    /// Any other reply; `first` is the integer it is or starts with (an array's first element).
    Value {
        first: Option<i64>,
    },
}

/// Parses one reply at the start of `buf`: `Ok(None)` until it is complete.
fn parse_reply(buf: &[u8]) -> Result<Option<(Reply, usize)>, String> {
    if buf.first() == Some(&b'-') {
        return Ok(line(buf, 1).map(|(text, end)| (Reply::Error(String::from_utf8_lossy(text).into_owned()), end)));
    }
    Ok(value(buf, 0, 0)?.map(|(first, end)| (Reply::Value { first }, end)))
}

/// The line starting at `at`, without its CRLF, and the position after it.
fn line(buf: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let rest = buf.get(at..)?;
    let cr = rest.windows(2).position(|w| w == b"\r\n")?;
    Some((&rest[..cr], at + cr + 2))
}

fn number(text: &[u8]) -> Result<i64, String> {
    std::str::from_utf8(text)
        .ok()
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| format!("protocol error: {:?} is not a number", String::from_utf8_lossy(text)))
}

/// Skips one value at `at`: its integer (or its first element's) and the position after it.
fn value(buf: &[u8], at: usize, depth: usize) -> Result<Option<(Option<i64>, usize)>, String> {
    let Some(&kind) = buf.get(at) else { return Ok(None) };
    let Some((text, end)) = line(buf, at + 1) else { return Ok(None) };
    match kind {
        b'+' | b'-' | b'_' | b',' | b'#' => Ok(Some((None, end))),
        b':' => Ok(Some((Some(number(text)?), end))),
        b'$' => {
            let len = number(text)?;
            if len < 0 {
                return Ok(Some((None, end)));
            }
            let len = usize::try_from(len).map_err(|_| "protocol error: bulk length".to_string())?;
            let total = end.checked_add(len).and_then(|n| n.checked_add(2)).ok_or("protocol error: bulk length")?;
            Ok((buf.len() >= total).then_some((None, total)))
        }
        b'*' => {
            if depth >= MAX_DEPTH {
                return Err(format!("protocol error: arrays nested deeper than {MAX_DEPTH}"));
            }
            let mut at = end;
            let mut first = None;
            for i in 0..number(text)?.max(0) {
                let Some((element, next)) = value(buf, at, depth + 1)? else { return Ok(None) };
                if i == 0 {
                    first = element;
                }
                at = next;
            }
            Ok(Some((first, at)))
        }
        other => Err(format!("protocol error: unexpected reply type {:?}", char::from(other))),
    }
}

/// What every RESP connection shares.
#[derive(Debug)]
pub(crate) struct Target {
    pub(crate) addr: String,
    pub(crate) command: Command,
    pub(crate) keys: Arc<Keys>,
    pub(crate) pipeline: usize,
    pub(crate) timeout: Duration,
}

/// What a connection waited for.
enum Event {
    Read(std::io::Result<usize>),
    Due,
    TimedOut,
}

/// A request written and not yet answered.
struct InFlight {
    /// Where its latency starts (see [`Ticket::start`]).
    start: Instant,
    sent: Instant,
    /// Its key's number.
    key: u64,
}

/// Runs one connection until the schedule is exhausted and every request is accounted for.
pub(crate) async fn connection(id: u64, target: Arc<Target>, schedule: Arc<Schedule>, shared: Arc<Shared>) -> Tally {
    let mut recorder = Recorder::new(shared);
    let mut rng = Rng::seeded(id);
    let mut stream: Option<TcpStream> = None;
    let mut in_flight: VecDeque<InFlight> = VecDeque::with_capacity(target.pipeline);
    let mut next: Option<Ticket> = None;
    let mut issuing = true;
    let (mut read_buf, mut write_buf) = (Vec::with_capacity(16 << 10), Vec::with_capacity(4 << 10));
    loop {
        let now = Instant::now();
        // A ticket is taken only when the pipeline has room, so a closed loop's ticket is
        // due when it is sent, not when an earlier reply was still awaited.
        if issuing && next.is_none() && in_flight.len() < target.pipeline {
            next = schedule.take(now);
            issuing = next.is_some();
        }
        if !issuing && in_flight.is_empty() {
            break;
        }
        let Some(socket) = stream.as_mut() else {
            match connect(&target.addr).await {
                Ok(socket) => stream = Some(socket),
                Err(error) => fail_unsent(&mut next, &schedule, &mut recorder, &error).await,
            }
            continue;
        };
        // Send every due request the pipeline has room for, in one write.
        while in_flight.len() < target.pipeline {
            let Some(ticket) = next.filter(|t| t.ready(now)) else { break };
            let key = target.keys.pick(&mut rng);
            target.command.encode(&target.keys.name(key), &mut write_buf);
            in_flight.push_back(InFlight { start: ticket.start(now), sent: now, key });
            next = None;
            if in_flight.len() < target.pipeline {
                next = schedule.take(now);
                issuing = next.is_some();
            }
        }
        if !write_buf.is_empty() {
            let written = socket.write_all(&write_buf).await;
            write_buf.clear();
            if let Err(error) = written {
                broken(
                    &mut stream,
                    &mut in_flight,
                    &mut recorder,
                    Failure::Transport(format!("write failed: {error}")),
                );
                read_buf.clear();
                continue;
            }
        }
        let send_next = next.filter(|_| in_flight.len() < target.pipeline).map(Ticket::wake);
        let give_up = in_flight.front().map(|r| r.sent + target.timeout);
        let event = tokio::select! {
            read = socket.read_buf(&mut read_buf), if !in_flight.is_empty() => Event::Read(read),
            () = sleep_until(send_next), if send_next.is_some() => Event::Due,
            () = sleep_until(give_up), if give_up.is_some() => Event::TimedOut,
        };
        let failure = match event {
            Event::Due => None,
            Event::TimedOut => Some(Failure::Timeout),
            Event::Read(Ok(0)) => Some(Failure::Transport("the server closed the connection".into())),
            Event::Read(Ok(_)) => take_replies(&target.command, &mut read_buf, &mut in_flight, &mut recorder)
                .err()
                .map(Failure::Transport),
            Event::Read(Err(error)) => Some(Failure::Transport(format!("read failed: {error}"))),
        };
        if let Some(failure) = failure {
            broken(&mut stream, &mut in_flight, &mut recorder, failure);
            read_buf.clear();
        }
    }
    recorder.finish()
}

async fn sleep_until(at: Option<Instant>) {
    if let Some(at) = at {
        tokio::time::sleep_until(at.into()).await;
    }
}

async fn connect(addr: &str) -> Result<TcpStream, String> {
    let socket = TcpStream::connect(addr).await.map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    socket.set_nodelay(true).map_err(|e| format!("cannot set TCP_NODELAY: {e}"))?;
    Ok(socket)
}

/// No connection: the request due next fails (in the open loop, with every other request
/// already due, so a dead server costs the schedule nothing), then a pause before retrying.
pub(crate) async fn fail_unsent(next: &mut Option<Ticket>, schedule: &Schedule, recorder: &mut Recorder, error: &str) {
    if let Some(ticket) = next.take() {
        tokio::time::sleep_until(ticket.due.into()).await;
        let now = Instant::now();
        recorder.record(ticket.due, now, Err(Failure::Transport(error.to_string())));
        while schedule.is_open_loop() {
            match schedule.take(now) {
                Some(t) if t.due <= now => recorder.record(t.due, now, Err(Failure::Transport(error.to_string()))),
                later => {
                    *next = later;
                    break;
                }
            }
        }
    }
    tokio::time::sleep(RECONNECT_PAUSE).await;
}

/// The connection is unusable: every request in flight fails with `failure`.
fn broken(
    stream: &mut Option<TcpStream>,
    in_flight: &mut VecDeque<InFlight>,
    recorder: &mut Recorder,
    failure: Failure,
) {
    *stream = None;
    let now = Instant::now();
    for request in in_flight.drain(..) {
        recorder.record(request.start, now, Err(failure.clone()));
    }
}

/// Records every complete reply in `buf` against the oldest requests in flight.
fn take_replies(
    command: &Command,
    buf: &mut Vec<u8>,
    in_flight: &mut VecDeque<InFlight>,
    recorder: &mut Recorder,
) -> Result<(), String> {
    let now = Instant::now();
    let mut at = 0;
    while let Some((reply, len)) = parse_reply(&buf[at..])? {
        at += len;
        let Some(request) = in_flight.pop_front() else {
            return Err("protocol error: a reply to no request".into());
        };
        recorder.record_key(request.key, request.start, now, command.answer(reply));
    }
    buf.drain(..at);
    if buf.len() > MAX_REPLY_BYTES {
        return Err(format!("a reply larger than {} MiB", MAX_REPLY_BYTES >> 20));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_split_like_redis_cli_and_encode_as_resp() {
        let command = Command::parse(r#"TG.CHECK {key} "sliding window" 10 'a b'"#).unwrap();
        assert_eq!(command.kind, ReplyKind::Check);
        let mut out = Vec::new();
        command.encode(b"k7", &mut out);
        assert_eq!(out, b"*5\r\n$8\r\nTG.CHECK\r\n$2\r\nk7\r\n$14\r\nsliding window\r\n$2\r\n10\r\n$3\r\na b\r\n");
        assert_eq!(Command::parse("cl.throttle {key} 1 2 3").unwrap().kind, ReplyKind::Throttle);
        assert_eq!(Command::parse("INCR x").unwrap().kind, ReplyKind::Plain);
        assert!(!Command::parse("INCR x").unwrap().has_key());
        assert!(Command::parse("  ").is_err());
        assert!(Command::parse("GET \"x").is_err());
    }

    #[test]
    fn replies_are_parsed_only_when_complete() {
        let throttle = b"*5\r\n:0\r\n:16\r\n:15\r\n:-1\r\n:2\r\n";
        assert_eq!(parse_reply(throttle).unwrap(), Some((Reply::Value { first: Some(0) }, throttle.len())));
        for cut in 0..throttle.len() {
            assert_eq!(parse_reply(&throttle[..cut]).unwrap(), None, "cut at {cut}");
        }
        assert_eq!(parse_reply(b":42\r\n").unwrap(), Some((Reply::Value { first: Some(42) }, 5)));
        assert_eq!(parse_reply(b"$3\r\nabc\r\n+OK").unwrap(), Some((Reply::Value { first: None }, 9)));
        assert_eq!(parse_reply(b"$3\r\nab").unwrap(), None);
        assert_eq!(parse_reply(b"$-1\r\n").unwrap(), Some((Reply::Value { first: None }, 5)));
        assert_eq!(parse_reply(b"-ERR no\r\n").unwrap(), Some((Reply::Error("ERR no".into()), 9)));
        assert!(parse_reply(b"?x\r\n").is_err());
        assert!(parse_reply(b":x\r\n").is_err());
        assert!(parse_reply(b"$99999999999999999999\r\n").is_err());
        assert!(parse_reply(&b"*1\r\n".repeat(MAX_DEPTH + 1)).is_err());
    }

    #[test]
    fn decisions_follow_each_commands_convention() {
        let throttle = Command::parse("CL.THROTTLE {key} 1 2 3").unwrap();
        let check = Command::parse("TG.CHECK {key} gcra 1 1000").unwrap();
        let incr = Command::parse("INCR {key}").unwrap();
        let value = |first| Reply::Value { first: Some(first) };
        assert_eq!(throttle.answer(value(0)), Ok(Answer::Allowed));
        assert_eq!(throttle.answer(value(1)), Ok(Answer::Denied));
        assert_eq!(check.answer(value(1)), Ok(Answer::Allowed));
        assert_eq!(check.answer(value(0)), Ok(Answer::Denied));
        assert_eq!(incr.answer(value(1)), Ok(Answer::Other));
        assert_eq!(check.answer(Reply::Error("ERR x".into())), Err(Failure::Reply("ERR x".into())));
    }
}
