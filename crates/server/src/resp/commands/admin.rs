//! The connection-level commands clients send on their own: enough of `PING`, `ECHO`, `HELLO`,
//! `CLIENT`, `COMMAND`, `INFO`, `SELECT`, `CONFIG` and `QUIT` for redis-cli, client libraries and
//! redis-benchmark.

use bytes::BytesMut;

use super::{Flow, reply};

const VERSION: &str = env!("CARGO_PKG_VERSION");

pub(super) fn run(name: &[u8], args: &[&[u8]], out: &mut BytesMut) -> Flow {
    let is = |candidate: &str| name.eq_ignore_ascii_case(candidate.as_bytes());
    if is("PING") {
        match args {
            [] => reply::simple(out, "PONG"),
            [message] => reply::bulk(out, message),
            _ => arity(out, "ping"),
        }
    } else if is("ECHO") {
        match args {
            [message] => reply::bulk(out, message),
            _ => arity(out, "echo"),
        }
    } else if is("QUIT") {
        reply::simple(out, "OK");
        return Flow::Close;
    } else if is("HELLO") {
        hello(args, out);
    } else if is("CLIENT") || is("SELECT") {
        // CLIENT SETNAME / SETINFO and SELECT 0 are what libraries send; one keyspace, no names kept.
        if args.first().is_some_and(|a| a.eq_ignore_ascii_case(b"GETNAME")) {
            out.extend_from_slice(b"$-1\r\n");
        } else if args.first().is_some_and(|a| a.eq_ignore_ascii_case(b"ID")) {
            reply::integer(out, 1);
        } else {
            reply::simple(out, "OK");
        }
    } else if is("CONFIG") {
        config(args, out);
    } else if is("COMMAND") {
        // No command docs to share: an empty list.
        reply::array(out, 0);
    } else if is("INFO") {
        let info = format!(
            "# Server\r\nredis_version:7.0.0\r\ntollgate_version:{VERSION}\r\nredis_mode:standalone\r\n\
             # Keyspace\r\n"
        );
        reply::bulk(out, info.as_bytes());
    } else {
        let shown = String::from_utf8_lossy(&name[..name.len().min(64)]).into_owned();
        reply::error(out, &format!("ERR unknown command '{shown}', with args beginning with: {}", preview(args)));
    }
    Flow::Continue
}

fn hello(args: &[&[u8]], out: &mut BytesMut) {
    if args.first().is_some_and(|version| **version != *b"2") {
        reply::error(out, "NOPROTO this server speaks RESP2 only");
        return;
    }
    reply::array(out, 10);
    for (field, value) in [("server", "tollgate"), ("version", VERSION), ("mode", "standalone"), ("role", "master")] {
        reply::bulk(out, field.as_bytes());
        reply::bulk(out, value.as_bytes());
    }
    reply::bulk(out, b"proto");
    reply::integer(out, 2);
}

/// `CONFIG GET save` / `appendonly` (redis-benchmark asks): nothing is persisted.
fn config(args: &[&[u8]], out: &mut BytesMut) {
    match args {
        [get, parameter] if get.eq_ignore_ascii_case(b"GET") => {
            let value: &[u8] = if parameter.eq_ignore_ascii_case(b"save") {
                b""
            } else if parameter.eq_ignore_ascii_case(b"appendonly") {
                b"no"
            } else {
                reply::array(out, 0);
                return;
            };
            reply::array(out, 2);
            reply::bulk(out, parameter);
            reply::bulk(out, value);
        }
        _ => reply::error(out, "ERR tollgate has no configuration to change at run time"),
    }
}

fn arity(out: &mut BytesMut, command: &str) {
    reply::error(out, &format!("ERR wrong number of arguments for '{command}' command"));
}

fn preview(args: &[&[u8]]) -> String {
    args.iter().take(3).map(|a| format!("'{}' ", String::from_utf8_lossy(&a[..a.len().min(32)]))).collect()
}
