//! A client of `tollgate proxy` on a raw socket, sending bytes as an attacker would and reading
//! the responses as they come (`common::raw_upstream` records what reaches the upstream).

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::proxy::Proxy;
use crate::common::raw_upstream::{Received, Seen};

/// A response as the client read it.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// A client connection speaking raw bytes.
pub struct Client {
    stream: TcpStream,
    buffer: Vec<u8>,
}

impl Client {
    pub async fn connect(proxy: &Proxy) -> Client {
        Client { stream: TcpStream::connect(proxy.at).await.unwrap(), buffer: Vec::new() }
    }

    pub async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.unwrap();
    }

    /// Sends `bytes`; false if the proxy closed the connection first.
    pub async fn try_send(&mut self, bytes: &[u8]) -> bool {
        self.stream.write_all(bytes).await.is_ok()
    }

    async fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 16384];
        match tokio::time::timeout(Duration::from_secs(15), self.stream.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => {
                self.buffer.extend_from_slice(&chunk[..n]);
                true
            }
            _ => false,
        }
    }

    /// The next response (its body framed by `Content-Length`); `None` if the connection closed
    /// (or went quiet for 15 s) first.
    pub async fn response(&mut self) -> Option<Response> {
        self.read_response(false).await
    }

    /// The next response, to a request whose response has no body (HEAD) when `bodiless`.
    pub async fn read_response(&mut self, bodiless: bool) -> Option<Response> {
        let end = loop {
            if let Some(end) = self.buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break end;
            }
            if !self.fill().await {
                return None;
            }
        };
        let head = String::from_utf8_lossy(&self.buffer[..end]).into_owned();
        self.buffer.drain(..end + 4);
        let mut lines = head.split("\r\n");
        let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let chunked = headers.iter().any(|(n, v)| n == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
        if chunked && !bodiless {
            let body = self.chunked_body().await?;
            return Some(Response { status, headers, body });
        }
        let length = headers.iter().find(|(n, _)| n == "content-length").and_then(|(_, v)| v.parse().ok());
        let length = if bodiless { 0 } else { length.unwrap_or(0) };
        let body = self.take(length).await?;
        Some(Response { status, headers, body })
    }

    /// The next `length` bytes; `None` if the connection closed first.
    async fn take(&mut self, length: usize) -> Option<Vec<u8>> {
        while self.buffer.len() < length {
            if !self.fill().await {
                return None;
            }
        }
        Some(self.buffer.drain(..length).collect())
    }

    /// A chunked body, decoded (chunk extensions and trailers are not expected).
    async fn chunked_body(&mut self) -> Option<Vec<u8>> {
        let mut body = Vec::new();
        loop {
            let line = loop {
                if let Some(at) = self.buffer.windows(2).position(|w| w == b"\r\n") {
                    break at;
                }
                if !self.fill().await {
                    return None;
                }
            };
            let size = usize::from_str_radix(std::str::from_utf8(&self.buffer[..line]).ok()?, 16).ok()?;
            self.buffer.drain(..line + 2);
            let chunk = self.take(size + 2).await?;
            body.extend_from_slice(&chunk[..size]);
            if size == 0 {
                return Some(body);
            }
        }
    }

    /// Whether the proxy closes the connection (within 10 s, nothing more arriving).
    pub async fn closed_by_proxy(&mut self) -> bool {
        let mut chunk = [0u8; 1024];
        matches!(tokio::time::timeout(Duration::from_secs(10), self.stream.read(&mut chunk)).await, Ok(Ok(0) | Err(_)))
    }
}

/// `METHOD target` with a Host, these header lines and `Content-Length` for a body, then the body.
pub fn request(method: &str, target: &str, headers: &[&str], body: &[u8]) -> Vec<u8> {
    let mut out = format!("{method} {target} HTTP/1.1\r\nHost: app.example\r\n").into_bytes();
    for header in headers {
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if !body.is_empty() && !headers.iter().any(|h| h.to_ascii_lowercase().starts_with("transfer-encoding")) {
        out.extend_from_slice(format!("Content-Length: {}\r\n", body.len()).as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    out
}

/// Sends one request on a fresh connection: its response, and what reached the upstream.
pub async fn exchange(proxy: &Proxy, seen: &Seen, bytes: &[u8]) -> (u16, Vec<Received>) {
    let before = seen.count();
    let mut client = Client::connect(proxy).await;
    client.send(bytes).await;
    let status = client.read_response(bytes.starts_with(b"HEAD ")).await.map_or(0, |r| r.status);
    // The upstream records a request before it answers: what it got is there by now.
    (status, seen.since(before))
}
