//! One RESP connection: read what the client sent, run every complete command in it (pipelined
//! commands are answered in one write), and repeat. A protocol error is answered and closes this
//! connection only.
//!
//! Bounded: a command's size and arguments (see `frame`), the time a reply may take to be written
//! (a client that never reads is closed after `write_timeout`), optionally the time a connection
//! may stay idle; buffers grown for a large command shrink back once it is done.

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::commands::{self, Flow};
use super::frame::{Bounds, Decoder};
use super::reply;
use crate::app::App;
use crate::config::RespBounds;

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
    let mut decoder = Decoder::default();
    let mut input = BytesMut::with_capacity(BUFFER);
    let mut output = BytesMut::with_capacity(BUFFER);
    loop {
        // Run every complete command already received.
        let mut close = false;
        loop {
            match decoder.decode(&input, frames) {
                Ok(Some(used)) => {
                    let ranges = decoder.args();
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
                        close = commands::execute(app, args, &mut output).await == Flow::Close;
                    }
                    input.advance(used);
                    if close {
                        break;
                    }
                }
                Ok(None) => break,
                Err(error) => {
                    reply::error(&mut output, &format!("ERR Protocol error: {error}"));
                    close = true;
                    break;
                }
            }
        }
        if !output.is_empty() {
            match tokio::time::timeout(bounds.write_timeout, stream.write_all(&output)).await {
                Ok(written) => written?,
                Err(_) => return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the client does not read")),
            }
            output.clear();
            shrink(&mut output);
        }
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
