//! One RESP connection: read what the client sent, run every complete command in it (pipelined
//! commands are answered in one write), and repeat. A protocol error is answered and closes this
//! connection only.

use std::ops::Range;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::commands::{self, Flow};
use super::frame::{self, Bounds};
use super::reply;
use crate::engine::Engine;

pub(super) async fn serve(
    mut stream: TcpStream,
    engine: &Engine,
    bounds: Bounds,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let mut input = BytesMut::with_capacity(16 * 1024);
    let mut output = BytesMut::with_capacity(16 * 1024);
    let mut ranges: Vec<Range<usize>> = Vec::new();
    loop {
        // Run every complete command already received.
        let mut close = false;
        loop {
            match frame::parse(&input, &mut ranges, bounds) {
                Ok(Some(used)) => {
                    if !ranges.is_empty() {
                        // Most commands have few arguments: borrow them from a stack array.
                        let mut small: [&[u8]; 8] = [&[]; 8];
                        let many: Vec<&[u8]>;
                        let args: &[&[u8]] = if ranges.len() <= small.len() {
                            for (slot, range) in small.iter_mut().zip(&ranges) {
                                *slot = &input[range.clone()];
                            }
                            &small[..ranges.len()]
                        } else {
                            many = ranges.iter().map(|r| &input[r.clone()]).collect();
                            &many
                        };
                        close = commands::execute(engine, args, &mut output).await == Flow::Close;
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
            stream.write_all(&output).await?;
            output.clear();
        }
        if close {
            return Ok(());
        }
        // Wait for more bytes, or for shutdown between commands.
        let read = tokio::select! {
            read = stream.read_buf(&mut input) => read?,
            _ = shutdown.wait_for(|&stop| stop) => return Ok(()),
        };
        if read == 0 {
            return Ok(());
        }
    }
}
