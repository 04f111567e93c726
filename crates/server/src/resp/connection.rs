//! One RESP connection: read what the client sent, run every complete command in it (pipelined
//! commands are answered in one write), and repeat. A protocol error is answered and closes this
//! connection only.
//!
//! Bounded: a command's size and arguments (see `frame`), the replies held (written out whenever
//! `max_output_bytes` are pending: a small pipelined command can have a large reply, so 16 KiB of
//! `HELLO`s once held over 250 KB), the time a reply may take to be written (a client that never
//! reads is closed after `write_timeout`), the time a connection may stay idle (`idle_timeout`,
//! 5 minutes by default); buffers grown for a large command shrink back once it is done.

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::batch;
use super::commands::{self, Flow};
use crate::app::App;
use crate::config::RespBounds;
use tollgate_resp::reply;
use tollgate_resp::request::{Bounds, Decoder};
use tollgate_store::Store;

/// The size buffers start at and shrink back to.
const BUFFER: usize = 16 * 1024;

pub(super) async fn serve(
    mut stream: TcpStream,
    app: &App,
    bounds: RespBounds,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let frames = Bounds {
        max_frame_bytes: bounds.max_frame_bytes,
        max_inline_bytes: bounds.max_inline_bytes,
        max_args: bounds.max_args,
    };
    let (mut decoder, mut lookahead) = (Decoder::default(), Decoder::default());
    let mut input = BytesMut::with_capacity(BUFFER);
    let mut output = BytesMut::with_capacity(BUFFER);
    loop {
        // Run every complete command already received, writing the replies out whenever
        // `max_output_bytes` are pending (a client that does not read then holds the connection
        // on the write, closed after `write_timeout`: never more than that buffered).
        let close = loop {
            let decoders = (&mut decoder, &mut lookahead);
            let batch = run(app, decoders, &mut input, &mut output, frames, bounds.max_output_bytes).await;
            if !output.is_empty() {
                match tokio::time::timeout(bounds.write_timeout, stream.write_all(&output)).await {
                    Ok(written) => written?,
                    Err(_) => {
                        return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the client does not read"));
                    }
                }
                output.clear();
                shrink(&mut output);
            }
            if batch != Batch::Full {
                break batch == Batch::Close;
            }
        };
        if close {
            return Ok(());
        }
        if !decoder.in_progress() {
            shrink(&mut input);
        }
        // Wait for more bytes, or for shutdown between commands.
        let read = async {
            match bounds.idle_timeout {
                Some(idle) => tokio::time::timeout(idle, stream.read_buf(&mut input)).await.unwrap_or(Ok(0)),
                None => stream.read_buf(&mut input).await,
            }
        };
        let read = tokio::select! {
            read = read => read?,
            _ = shutdown.wait_for(|&stop| stop) => return Ok(()),
        };
        if read == 0 {
            return Ok(());
        }
    }
}

/// How a run of commands ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Batch {
    /// Every complete command was run.
    Done,
    /// The replies reached the output limit; complete commands may remain.
    Full,
    /// The connection is to be closed (QUIT, or a protocol error answered).
    Close,
}

/// Runs the complete commands at the start of `input` (consuming them), appending their replies
/// to `output`, until none is left or `output` holds at least `max_output` bytes (past it by one
/// reply, or by one batch of decisions whose commands fit the room left: see [`batch::run`]).
/// `decoders`: the connection's, and one to look at the commands after the current one with.
async fn run(
    app: &App,
    (decoder, lookahead): (&mut Decoder, &mut Decoder),
    input: &mut BytesMut,
    output: &mut BytesMut,
    frames: Bounds,
    max_output: usize,
) -> Batch {
    // A store that decides in place (memory) completes every command in the poll that reads it:
    // nothing to gain from running several at once.
    let batching = !app.engine.store().decides_in_place();
    loop {
        if output.len() >= max_output {
            return Batch::Full;
        }
        match decoder.decode(input, frames) {
            Ok(Some(used)) => {
                let ranges = decoder.args();
                if batching && used < input.len() && batch::joins(input, ranges, used, frames, lookahead) {
                    let room = max_output.saturating_sub(output.len());
                    let decided = batch::run(app, input, (ranges, used), frames, room, lookahead, output).await;
                    input.advance(decided);
                    continue;
                }
                let mut close = false;
                if !ranges.is_empty() {
                    // Most commands have few arguments: borrow them from a stack array.
                    let mut small: [&[u8]; 8] = [&[]; 8];
                    let many: Vec<&[u8]>;
                    let args: &[&[u8]] = if ranges.len() <= small.len() {
                        for (slot, range) in small.iter_mut().zip(ranges) {
                            *slot = &input[range.clone()];
                        }
                        &small[..ranges.len()]
                    } else {
                        many = ranges.iter().map(|r| &input[r.clone()]).collect();
                        &many
                    };
                    close = commands::execute(app, args, output).await == Flow::Close;
                }
                input.advance(used);
                if close {
                    return Batch::Close;
                }
            }
            Ok(None) => return Batch::Done,
            Err(error) => {
                reply::error(output, &format!("ERR Protocol error: {error}"));
                return Batch::Close;
            }
        }
    }
}

/// Gives back the memory of a buffer grown for a large command, keeping what it holds.
fn shrink(buffer: &mut BytesMut) {
    if buffer.capacity() > 4 * BUFFER && buffer.len() <= BUFFER {
        let mut fresh = BytesMut::with_capacity(BUFFER);
        fresh.extend_from_slice(buffer);
        *buffer = fresh;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Before: every complete command received was run before anything was written, so 16 KiB of
    /// pipelined `HELLO` (a 7-byte command with a reply over 100 bytes) held over 250 KB of
    /// replies. Now a run stops once the limit is reached, and the rest runs after the write.
    #[tokio::test]
    async fn replies_are_held_up_to_the_output_limit() {
        let app = App::new(&crate::Config::default()).await.unwrap();
        let mut input = BytesMut::new();
        while input.len() < 16 << 10 {
            input.extend_from_slice(b"HELLO\r\n");
        }
        let frames = Bounds { max_frame_bytes: 1 << 20, max_inline_bytes: 64 << 10, max_args: 1024 };
        let (mut decoder, mut output, limit) = (Decoder::default(), BytesMut::new(), 4 << 10);
        let mut lookahead = Decoder::default();
        let (mut runs, mut largest, mut written) = (0, 0, 0);
        loop {
            let batch = run(&app, (&mut decoder, &mut lookahead), &mut input, &mut output, frames, limit).await;
            runs += 1;
            largest = largest.max(output.len());
            written += output.len();
            output.clear();
            if batch != Batch::Full {
                assert_eq!(batch, Batch::Done);
                break;
            }
        }
        assert!(input.is_empty(), "every command ran");
        assert!(written > 250 << 10, "{written} bytes of replies");
        assert!(largest < limit + 1024, "held at most the limit and one reply: {largest}");
        assert!(runs > 50, "{runs} runs");
    }

    /// On Redis, pipelined decisions are decided in batches; a batch of wrong commands whose
    /// errors quote a large argument must not hold more than the output bound either. Before the
    /// batch was bounded by its commands' bytes, 64 of them (60 KiB each) were held at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_of_large_errors_is_held_up_to_the_output_limit() {
        let redis = tollgate_store::testkit::redis_server::RedisServer::start();
        let config = crate::Config { store: crate::StoreConfig::redis(&redis.url()), ..crate::Config::default() };
        let app = App::new(&config).await.unwrap();
        let wrong = "x".repeat(60 << 10);
        let mut input = BytesMut::new();
        for i in 0..64 {
            let mut command = Vec::new();
            tollgate_resp::command::encode(&["CL.THROTTLE", &format!("k{i}"), "1", "1", &wrong], &mut command);
            input.extend_from_slice(&command);
        }
        let frames = Bounds { max_frame_bytes: 1 << 20, max_inline_bytes: 64 << 10, max_args: 1024 };
        let (mut decoder, mut output, limit) = (Decoder::default(), BytesMut::new(), 64 << 10);
        let mut lookahead = Decoder::default();
        let (mut largest, mut errors) = (0, 0);
        loop {
            let batch = run(&app, (&mut decoder, &mut lookahead), &mut input, &mut output, frames, limit).await;
            largest = largest.max(output.len());
            errors += output.windows(27).filter(|w| w == b"ERR Couldn't parse as integ").count();
            output.clear();
            if batch != Batch::Full {
                assert_eq!(batch, Batch::Done);
                break;
            }
        }
        assert_eq!(errors, 64, "every command answered");
        assert!(largest <= limit + (61 << 10), "held {largest} bytes of replies (limit {limit})");
    }

    /// The batch bound counts its commands' bytes as the room their replies take; an error quoting
    /// an argument that is not UTF-8 quotes each of its bytes as U+FFFD (3 bytes), so a batch of
    /// such commands holds three times the room. One by one, the replies held never exceed the
    /// limit by more than one reply.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_of_errors_quoting_bytes_that_are_not_utf8_is_held_up_to_the_output_limit() {
        let redis = tollgate_store::testkit::redis_server::RedisServer::start();
        let config = crate::Config { store: crate::StoreConfig::redis(&redis.url()), ..crate::Config::default() };
        let app = App::new(&config).await.unwrap();
        let wrong = vec![0xFF_u8; 1 << 10];
        let mut input = BytesMut::new();
        for i in 0..64 {
            let mut command = Vec::new();
            let key = format!("k{i}");
            tollgate_resp::command::encode(&[&b"CL.THROTTLE"[..], key.as_bytes(), &wrong, b"1", b"1"], &mut command);
            input.extend_from_slice(&command);
        }
        let frames = Bounds { max_frame_bytes: 1 << 20, max_inline_bytes: 64 << 10, max_args: 1024 };
        let (mut decoder, mut output, limit) = (Decoder::default(), BytesMut::new(), 16 << 10);
        let mut lookahead = Decoder::default();
        let (mut largest, mut errors) = (0, 0);
        loop {
            let batch = run(&app, (&mut decoder, &mut lookahead), &mut input, &mut output, frames, limit).await;
            largest = largest.max(output.len());
            errors += output.windows(27).filter(|w| w == b"ERR Couldn't parse as integ").count();
            output.clear();
            if batch != Batch::Full {
                assert_eq!(batch, Batch::Done);
                break;
            }
        }
        assert_eq!(errors, 64, "every command answered");
        let one_reply = "-ERR Couldn't parse as integer: \r\n".len() + 3 * wrong.len();
        assert!(largest <= limit + one_reply, "held {largest} bytes of replies (limit {limit}, one reply {one_reply})");
    }

    #[test]
    fn a_buffer_grown_for_a_large_command_shrinks_back_keeping_its_bytes() {
        let mut buffer = BytesMut::with_capacity(1 << 20);
        buffer.extend_from_slice(b"PING\r\n");
        shrink(&mut buffer);
        assert_eq!(&buffer[..], b"PING\r\n");
        assert!(buffer.capacity() <= 2 * BUFFER, "{}", buffer.capacity());
        let mut small = BytesMut::with_capacity(BUFFER);
        shrink(&mut small);
        assert_eq!(small.capacity(), BUFFER, "left alone");
    }
}
