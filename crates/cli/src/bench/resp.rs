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
use tollgate_resp::command;
use tollgate_resp::value::{Skimmed, skim};

use super::keys::{Keys, Rng, Template};
use super::record::{Answer, Failure, Recorder, Shared, Tally};
use super::schedule::{Schedule, Ticket};

/// A reply larger than this breaks the connection rather than growing the buffer without end.
const MAX_REPLY_BYTES: usize = 64 << 20;
/// How long a connection waits before trying again after it could not connect.
const RECONNECT_PAUSE: Duration = Duration::from_millis(50);

/// How a command's reply says whether the request was admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReplyKind {
    /// `CL.THROTTLE`: `[limited 0/1, …]`.
    Throttle,
    /// `TG.CHECK`, `TG.PEEK`, `TG.LIMIT`, throttlecrab-server's `THROTTLE`: `[allowed 1/0, …]`.
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
        let words = command::split_words(line).map_err(|e| format!("--command: {e}"))?;
        let Some(name) = words.first() else {
            return Err("--command is empty (e.g. --command \"CL.THROTTLE {key} 15 30 60 1\")".into());
        };
        let kind = match name.to_ascii_uppercase().as_str() {
            "CL.THROTTLE" => ReplyKind::Throttle,
            "TG.CHECK" | "TG.PEEK" | "TG.LIMIT" | "THROTTLE" => ReplyKind::Check,
            _ => ReplyKind::Plain,
        };
        Ok(Command { args: words.iter().map(|w| Template::new(w)).collect(), kind })
    }

    pub(crate) fn has_key(&self) -> bool {
        self.args.iter().any(Template::has_key)
    }

    /// Appends the command for `key` in RESP's array-of-bulk-strings form.
    fn encode(&self, key: &[u8], out: &mut Vec<u8>) {
        command::array_header(self.args.len(), out);
        for arg in &self.args {
            command::bulk_header(arg.rendered_len(key), out);
            arg.render_into(key, out);
            out.extend_from_slice(b"\r\n");
        }
    }

    /// What a parsed reply means for this command.
    fn answer(&self, reply: Skimmed) -> Result<Answer, Failure> {
        match (reply, self.kind) {
            (Skimmed::Error(text), _) => Err(Failure::Reply(text)),
            (Skimmed::Value { first: Some(0) }, ReplyKind::Throttle)
            | (Skimmed::Value { first: Some(1) }, ReplyKind::Check) => Ok(Answer::Allowed),
            (Skimmed::Value { first: Some(1) }, ReplyKind::Throttle)
            | (Skimmed::Value { first: Some(0) }, ReplyKind::Check) => Ok(Answer::Denied),
            (Skimmed::Value { .. }, _) => Ok(Answer::Other),
        }
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
    while let Some((reply, len)) = skim(&buf[at..]).map_err(|e| e.to_string())? {
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
    fn decisions_follow_each_commands_convention() {
        let throttle = Command::parse("CL.THROTTLE {key} 1 2 3").unwrap();
        let check = Command::parse("TG.CHECK {key} gcra 1 1000").unwrap();
        let incr = Command::parse("INCR {key}").unwrap();
        let value = |first| Skimmed::Value { first: Some(first) };
        assert_eq!(throttle.answer(value(0)), Ok(Answer::Allowed));
        assert_eq!(throttle.answer(value(1)), Ok(Answer::Denied));
        assert_eq!(check.answer(value(1)), Ok(Answer::Allowed));
        assert_eq!(check.answer(value(0)), Ok(Answer::Denied));
        assert_eq!(incr.answer(value(1)), Ok(Answer::Other));
        assert_eq!(check.answer(Skimmed::Error("ERR x".into())), Err(Failure::Reply("ERR x".into())));
    }

    #[test]
    fn throttlecrabs_throttle_is_a_decision_with_one_for_allowed() {
        // throttlecrab-server's `THROTTLE key max_burst count period [quantity]` replies
        // `[allowed (1 = allowed), limit, remaining, reset_after, retry_after]`.
        let throttle = Command::parse("throttle {key} 16 30 60 1").unwrap();
        let value = |first| Skimmed::Value { first: Some(first) };
        assert_eq!(throttle.answer(value(1)), Ok(Answer::Allowed));
        assert_eq!(throttle.answer(value(0)), Ok(Answer::Denied));
    }
}
