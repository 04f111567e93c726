//! The idle bound of every listener of `tollgate serve`, set from the command line: a RESP
//! connection that sends nothing, an HTTP connection kept alive after its request, and a gRPC
//! connection past its preface that sends no request are each closed after theirs; `0` and
//! `never` turn the RESP and gRPC ones off.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use support::Tollgate;

/// Whether the server closes `stream` within 10 s, reading (and dropping) what it sends.
fn closed_by_the_server(mut stream: TcpStream) -> bool {
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let mut buffer = [0u8; 4096];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(error) => {
                return error.kind() != std::io::ErrorKind::WouldBlock && error.kind() != std::io::ErrorKind::TimedOut;
            }
        }
    }
}

fn connect(address: SocketAddr, first: &[u8]) -> TcpStream {
    let mut stream = TcpStream::connect(address).expect("connect");
    stream.write_all(first).expect("write");
    stream
}

/// The HTTP/2 preface and an empty SETTINGS frame: a gRPC client that has yet to send a request.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";

#[test]
fn every_listener_closes_a_connection_idle_past_its_bound() {
    let serve =
        Tollgate::serve(&["--idle-timeout", "300ms", "--grpc-idle-timeout", "300ms", "--http-header-timeout", "300ms"]);
    assert!(closed_by_the_server(connect(serve.resp(), b"PING\r\n")), "RESP");
    assert!(closed_by_the_server(connect(serve.http(), b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")), "HTTP");
    assert!(closed_by_the_server(connect(serve.grpc(), PREFACE)), "gRPC");
}

/// `0` and `never` are taken (what they parse to is `units::timeout`'s test).
#[test]
fn an_idle_bound_can_be_turned_off() {
    for off in ["0", "never"] {
        let serve = Tollgate::serve(&["--idle-timeout", off, "--grpc-idle-timeout", off]);
        let mut resp = connect(serve.resp(), b"PING\r\n");
        let mut pong = [0u8; 7];
        resp.read_exact(&mut pong).expect("PONG");
        assert_eq!(&pong, b"+PONG\r\n");
    }
}
