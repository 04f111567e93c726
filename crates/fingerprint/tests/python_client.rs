//! A real ClientHello: what Python's `ssl` module (OpenSSL) sends to a TCP listener of the test,
//! read as raw bytes. Skipped, with a note, where `python3` is missing.

use std::io::{ErrorKind, Read};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tollgate_fingerprint::{ClientHello, client_hello_from_records};

/// Connects with TLS to 127.0.0.1:argv[1] with an SNI and ALPN, and prints the ClientHello
/// handshake message as OpenSSL reports writing it (CPython's message callback), in hex. The
/// handshake then fails when the test closes the connection; that is expected.
const CLIENT: &str = r#"
import socket, ssl, sys
ctx = ssl.create_default_context()
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
ctx.set_alpn_protocols(["h2", "http/1.1"])
def seen(conn, direction, version, content_type, msg_type, data):
    if direction == "write" and content_type == ssl._TLSContentType.HANDSHAKE and data[:1] == b"\x01":
        print(data.hex(), flush=True)
try:
    ctx._msg_callback = seen
except Exception:
    pass
sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=20)
try:
    ctx.wrap_socket(sock, server_hostname="tollgate.example")
except (OSError, ssl.SSLError):
    pass
"#;

#[test]
fn python_ssl_client_hello() {
    if Command::new("python3").arg("--version").output().is_err() {
        eprintln!("note: python3 not found; skipping the real-client ClientHello test");
        return;
    }
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    let mut child = Command::new("python3")
        .args(["-c", CLIENT, &port])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stream = accept_within(&listener, Duration::from_secs(20));
    let hello = stream.map(read_hello);
    // The connection is closed (read_hello dropped it) and the message already printed: the
    // client has nothing more to tell.
    let _ = child.kill();
    let output = child.wait_with_output().unwrap();
    let hello = hello.unwrap_or_else(|| panic!("no connection; python: {}", String::from_utf8_lossy(&output.stderr)));

    let ja4 = hello.ja4();
    eprintln!("python ssl: ja4 {ja4} ja3 {} ({})", hello.ja3(), hello.ja3_string());
    assert!(ja4.starts_with("t13d"), "{ja4}");
    assert_eq!(ja4.get(8..10), Some("h2"));
    // FoxIO's ja4plus-mapping.csv lists `t13d181000_85036bcba153_d41ae481755e` for Python (no
    // ALPN); the hashed parts depend on the OpenSSL version and its configuration, so they are
    // shown, not asserted.
    let python = "85036bcba153_d41ae481755e";
    eprintln!(
        "hashed parts {} FoxIO's published Python JA4",
        if ja4.ends_with(python) { "match" } else { "differ from" }
    );
    assert_eq!(hello.sni.as_deref(), Some("tollgate.example"));
    assert_eq!(hello.alpn, [b"h2".to_vec(), b"http/1.1".to_vec()]);
    assert!(hello.supported_versions.contains(&0x0304));
    for ext in [0x0000, 0x000a, 0x000d, 0x0010, 0x002b, 0x0033] {
        assert!(hello.extensions.contains(&ext), "extension {ext:#06x} in {:?}", hello.extensions);
    }
    // OpenSSL sends no GREASE: JA4 counts and JA3 lists every extension and cipher suite.
    let count = |at: std::ops::Range<usize>| ja4.get(at).and_then(|n| n.parse::<usize>().ok());
    assert_eq!(count(4..6), Some(hello.cipher_suites.len().min(99)));
    assert_eq!(count(6..8), Some(hello.extensions.len().min(99)));
    let ja3 = hello.ja3_string();
    let ja3_extensions = ja3.split(',').nth(2).unwrap();
    assert_eq!(ja3_extensions.split('-').count(), hello.extensions.len());

    // The message OpenSSL reports it wrote, when this Python exposes it, is the one reassembled
    // from the records.
    let stdout = String::from_utf8_lossy(&output.stdout);
    if let Some(line) = stdout.lines().find(|l| !l.trim().is_empty()) {
        let bytes: Vec<u8> =
            (0..line.len() / 2).map(|i| u8::from_str_radix(&line[2 * i..2 * i + 2], 16).unwrap()).collect();
        assert_eq!(ClientHello::parse(&bytes), Ok(hello));
    } else {
        eprintln!("note: this Python does not report the handshake messages it writes; not compared");
    }
}

fn accept_within(listener: &TcpListener, limit: Duration) -> Option<TcpStream> {
    listener.set_nonblocking(true).unwrap();
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false).unwrap();
                return Some(stream);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => panic!("accept: {e}"),
        }
    }
    None
}

/// Reads until the bytes hold a ClientHello, as a server would.
fn read_hello(mut stream: TcpStream) -> ClientHello {
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut bytes = Vec::new();
    let mut buf = [0; 4096];
    loop {
        let n = stream.read(&mut buf).unwrap();
        assert!(n > 0, "connection closed after {} bytes", bytes.len());
        bytes.extend_from_slice(&buf[..n]);
        if let Some(hello) = client_hello_from_records(&bytes).unwrap() {
            return hello;
        }
    }
}
