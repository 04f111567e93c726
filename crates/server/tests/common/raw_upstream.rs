//! An upstream on a raw socket that records every request exactly as it arrives (its head's
//! bytes, its body, the upstream connection it came on) and answers the target it read, as a
//! lenient HTTP/1.1 server does: keep-alive, requests read one after the other from one buffer,
//! and the body of a GET, HEAD or DELETE (or of any request to `/static`) ignored, as many
//! servers ignore a body they do not expect (the "CL.0" desync).
//!
//! Targets it treats specially: `/big` is answered with [`BIG`] bytes, `/slow…` after
//! [`SLOW`], `/smuggled-slow…` after a second, `/chunked-and-length` with a chunked `hello`
//! that also declares `Content-Length: 3` (a response RFC 9112 section 6.3 says to read as
//! chunked, with its length removed by a proxy), `/stuck` never (nor its body read).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The size of the answer to `/big`: more than loopback's socket buffers hold.
pub const BIG: usize = 64 << 20;
/// How long `/slow` takes to be answered.
pub const SLOW: Duration = Duration::from_secs(4);

/// One request as the upstream read it.
#[derive(Debug, Clone)]
pub struct Received {
    /// Which upstream connection it came on (0, 1, ... in the order they were accepted).
    pub connection: usize,
    pub method: String,
    pub target: String,
    /// The header lines, `(name, value)` as sent (values as bytes read lossily).
    pub headers: Vec<(String, String)>,
    /// The body as the upstream framed it.
    pub body: Vec<u8>,
}

impl Received {
    /// Every value of header `name` (case-insensitive), one per line, in order.
    pub fn lines(&self, name: &str) -> Vec<String> {
        self.headers.iter().filter(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.clone()).collect()
    }

    /// Whether the request had a header `name`.
    pub fn has(&self, name: &str) -> bool {
        !self.lines(name).is_empty()
    }
}

/// What the upstream has seen.
#[derive(Default)]
pub struct Seen {
    pub requests: Mutex<Vec<Received>>,
    /// Connections the upstream has seen closed (by the proxy, or by a failed write).
    pub closed: Mutex<usize>,
    accepted: Mutex<usize>,
}

impl Seen {
    pub fn requests(&self) -> Vec<Received> {
        self.requests.lock().unwrap().clone()
    }

    pub fn count(&self) -> usize {
        self.requests.lock().unwrap().len()
    }

    /// The requests after the first `from`.
    pub fn since(&self, from: usize) -> Vec<Received> {
        self.requests.lock().unwrap()[from..].to_vec()
    }
}

/// Starts the upstream: its base URL and what it records.
pub async fn start() -> (String, Arc<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address: SocketAddr = listener.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let recorder = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let id = {
                let mut accepted = recorder.accepted.lock().unwrap();
                *accepted += 1;
                *accepted - 1
            };
            let recorder = recorder.clone();
            tokio::spawn(async move {
                serve(stream, id, &recorder).await;
                *recorder.closed.lock().unwrap() += 1;
            });
        }
    });
    (format!("http://{address}"), seen)
}

/// Serves one connection until it closes.
async fn serve(mut stream: TcpStream, connection: usize, seen: &Seen) {
    let mut buffer = Vec::new();
    loop {
        let Some(end) = fill_until_head(&mut stream, &mut buffer).await else { return };
        let head = String::from_utf8_lossy(&buffer[..end]).into_owned();
        buffer.drain(..end + 4);
        let mut lines = head.split("\r\n");
        let mut request_line = lines.next().unwrap_or_default().split(' ');
        let (method, target) =
            (request_line.next().unwrap_or_default().to_string(), request_line.next().unwrap_or_default().to_string());
        let headers: Vec<(String, String)> = lines
            .filter_map(|line| line.split_once(':'))
            .map(|(name, value)| (name.to_string(), value.trim().to_string()))
            .collect();
        let mut received = Received { connection, method, target, headers, body: Vec::new() };
        if received.target == "/stuck" {
            // A hung service whose kernel took the connection: the body is never read.
            seen.requests.lock().unwrap().push(received.clone());
            std::future::pending::<()>().await;
        }
        let ignores_body =
            matches!(received.method.as_str(), "GET" | "HEAD" | "DELETE") || received.target == "/static";
        if !ignores_body {
            let chunked =
                received.lines("transfer-encoding").iter().any(|v| v.to_ascii_lowercase().contains("chunked"));
            let length = received.lines("content-length").first().and_then(|v| v.parse::<usize>().ok());
            received.body = if chunked {
                match read_chunked(&mut stream, &mut buffer).await {
                    Some(body) => body,
                    None => return,
                }
            } else {
                let length = length.unwrap_or(0);
                while buffer.len() < length {
                    if !fill(&mut stream, &mut buffer).await {
                        return;
                    }
                }
                buffer.drain(..length).collect()
            };
        }
        let close = received.lines("connection").iter().any(|v| v.eq_ignore_ascii_case("close"));
        let target = received.target.clone();
        seen.requests.lock().unwrap().push(received);
        if target.starts_with("/slow") {
            tokio::time::sleep(SLOW).await;
        } else if target.starts_with("/smuggled-slow") {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let written = if target == "/chunked-and-length" {
            let reply =
                "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
            stream.write_all(reply.as_bytes()).await
        } else if target == "/big" {
            let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {BIG}\r\n\r\n");
            let chunk = vec![b'x'; 1 << 20];
            let mut result = stream.write_all(head.as_bytes()).await;
            for _ in 0..BIG / chunk.len() {
                if result.is_err() {
                    break;
                }
                result = stream.write_all(&chunk).await;
            }
            result
        } else {
            let reply = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{target}", target.len());
            stream.write_all(reply.as_bytes()).await
        };
        if written.is_err() || close {
            return;
        }
    }
}

/// Reads until `buffer` holds a whole head; the offset of its blank line, or `None` at the end.
async fn fill_until_head(stream: &mut TcpStream, buffer: &mut Vec<u8>) -> Option<usize> {
    loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            return Some(end);
        }
        if !fill(stream, buffer).await {
            return None;
        }
    }
}

/// Reads more bytes into `buffer`; false at the end of the stream.
async fn fill(stream: &mut TcpStream, buffer: &mut Vec<u8>) -> bool {
    let mut chunk = [0u8; 8192];
    match stream.read(&mut chunk).await {
        Ok(0) | Err(_) => false,
        Ok(n) => {
            buffer.extend_from_slice(&chunk[..n]);
            true
        }
    }
}

/// A chunked body, decoded.
async fn read_chunked(stream: &mut TcpStream, buffer: &mut Vec<u8>) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = loop {
            if let Some(at) = buffer.windows(2).position(|w| w == b"\r\n") {
                break at;
            }
            if !fill(stream, buffer).await {
                return None;
            }
        };
        let size_text = String::from_utf8_lossy(&buffer[..line_end]).into_owned();
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        buffer.drain(..line_end + 2);
        while buffer.len() < size + 2 {
            if !fill(stream, buffer).await {
                return None;
            }
        }
        body.extend(buffer.drain(..size));
        buffer.drain(..2);
        if size == 0 {
            return Some(body);
        }
    }
}
