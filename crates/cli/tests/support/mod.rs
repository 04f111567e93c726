//! What several CLI tests share: a running `tollgate serve` on free ports, its addresses read
//! from its log, and its metrics.

#![allow(dead_code, unreachable_pub)] // Each test binary uses its own part.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};

/// A running `tollgate serve`: its RESP, HTTP and gRPC addresses.
pub struct Serve {
    child: Child,
    pub resp: SocketAddr,
    pub http: SocketAddr,
    pub grpc: SocketAddr,
}

impl Serve {
    /// `serve` on free loopback ports with `args` (e.g. `["--store", url]`).
    pub fn start(args: &[&str]) -> Serve {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(["serve", "--resp", "127.0.0.1:0", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
            .args(["--log-level", "info"])
            .args(args)
            .stderr(Stdio::piped())
            .spawn()
            .expect("tollgate runs");
        let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
        let address = |line: &str| {
            line.split("listening on ").nth(1).and_then(|a| a.split_whitespace().next()).and_then(|a| a.parse().ok())
        };
        let (mut resp, mut http, mut grpc) = (None, None, None);
        while resp.is_none() || http.is_none() || grpc.is_none() {
            let line = lines.next().expect("a log line (did serve exit?)").expect("utf-8");
            if line.contains("RESP listening on") {
                resp = address(&line);
            } else if line.contains("HTTP listening on") {
                http = address(&line);
            } else if line.contains("gRPC (Envoy rate-limit service) listening on") {
                grpc = address(&line);
            }
        }
        // Keep draining stderr so that the server never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines.by_ref() {});
        Serve {
            child,
            resp: resp.expect("RESP address"),
            http: http.expect("HTTP address"),
            grpc: grpc.expect("gRPC address"),
        }
    }

    /// The sum of every sample of the metric lines starting with `name`.
    pub fn metric(&self, name: &str) -> f64 {
        let mut stream = TcpStream::connect(self.http).expect("connect");
        write!(stream, "GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").expect("write");
        let mut body = String::new();
        stream.read_to_string(&mut body).expect("read");
        body.lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
            .sum()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
