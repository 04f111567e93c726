//! Every RESP error a user can act on (the project's issue 12): each command answers its own usage,
//! options are checked by name (a peek's COST, unknown and repeated options), an unknown limit
//! says what the server has, and `max_frame_bytes` bounds whole commands. Before, `TG.RESET k`
//! answered TG.CHECK's usage, `TG.PEEK ... COST 3` an "unknown option", `TG.LIMIT` on a server
//! without rules did not say it had none, and a 60-byte inline command passed a 20-byte bound.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::Server;
use tollgate_server::{Config, RespBounds};

/// One RESP connection speaking arrays, its replies rendered as text: `-ERR ...`, `+OK`, `:1`,
/// `"bulk"`, `[a, b]`.
struct Conn {
    reader: BufReader<TcpStream>,
}

impl Conn {
    fn open(server: &Server) -> Conn {
        let stream = TcpStream::connect(server.resp).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        Conn { reader: BufReader::new(stream) }
    }

    fn ask(&mut self, args: &[&str]) -> String {
        let mut request = format!("*{}\r\n", args.len());
        for arg in args {
            request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
        }
        self.reader.get_mut().write_all(request.as_bytes()).unwrap();
        self.reply()
    }

    fn reply(&mut self) -> String {
        let mut line = Vec::new();
        self.reader.read_until(b'\n', &mut line).unwrap();
        let line = String::from_utf8_lossy(&line).trim_end().to_string();
        let (kind, rest) = line.split_at(1);
        match kind {
            "$" => {
                let Ok(len) = rest.parse::<usize>() else { return "(nil)".into() };
                let mut data = vec![0; len + 2];
                self.reader.read_exact(&mut data).unwrap();
                format!("{:?}", String::from_utf8_lossy(&data[..len]))
            }
            "*" => {
                let items: Vec<String> = (0..rest.parse::<usize>().unwrap()).map(|_| self.reply()).collect();
                format!("[{}]", items.join(", "))
            }
            _ => line,
        }
    }
}

/// Raw bytes in; everything the server answered, and whether it then closed the connection.
fn raw(server: &Server, bytes: &[u8]) -> (String, bool) {
    let mut stream = TcpStream::connect(server.resp).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    stream.write_all(bytes).unwrap();
    let mut reply = Vec::new();
    let closed = stream.read_to_end(&mut reply).is_ok();
    (String::from_utf8_lossy(&reply).into_owned(), closed)
}

fn with_rules(text: &str) -> Config {
    Config { rules: tollgate_rules::Rules::parse(text, "test").unwrap(), ..common::manual_config() }
}

fn check_all(con: &mut Conn, cases: &[(&[&str], &str)]) {
    for (args, wanted) in cases {
        assert_eq!(con.ask(args), *wanted, "{args:?}");
    }
    assert_eq!(con.ask(&["PING"]), "+PONG", "every error leaves the connection open");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_answers_its_own_usage() {
    let server = Server::start(common::manual_config()).await;
    let mut con = Conn::open(&server);
    let cases: &[(&[&str], &str)] = &[
        (
            &["TG.RESET", "user123"],
            "-ERR Usage: TG.RESET <key> <algorithm> <count> <period_ms|day|week|month|year> [BURST <b>] [SLICES <s>] [TZ <zone>]",
        ),
        (
            &["TG.PEEK", "k", "gcra"],
            "-ERR Usage: TG.PEEK <key> <algorithm> <count> <period_ms|day|week|month|year> [BURST <b>] [SLICES <s>] [TZ <zone>]",
        ),
        (
            &["tg.check", "k"],
            "-ERR Usage: TG.CHECK <key> <algorithm> <count> <period_ms|day|week|month|year> [BURST <b>] [SLICES <s>] [COST <c>] [TZ <zone>]",
        ),
        (&["TG.LIMIT", "api"], "-ERR Usage: TG.LIMIT <name> <key> [COST <c>]"),
        (&["TG.LIMIT"], "-ERR Usage: TG.LIMIT <name> <key> [COST <c>]"),
        (
            &["CL.THROTTLE", "k", "1", "2"],
            "-ERR Usage: CL.THROTTLE <key> <max_burst> <count per period> <period> [<quantity>]",
        ),
        (
            &["CL.THROTTLE", "k", "1", "2", "3", "4", "5"],
            "-ERR Usage: CL.THROTTLE <key> <max_burst> <count per period> <period> [<quantity>]",
        ),
        (&["PING", "a", "b"], "-ERR wrong number of arguments for 'ping' command"),
        (&["ECHO"], "-ERR wrong number of arguments for 'echo' command"),
        (&["ECHO", "a", "b"], "-ERR wrong number of arguments for 'echo' command"),
        (&["SELECT"], "-ERR wrong number of arguments for 'select' command"),
        (&["SELECT", "0", "1"], "-ERR wrong number of arguments for 'select' command"),
        (&["CLIENT"], "-ERR wrong number of arguments for 'client' command"),
        (&["CLIENT", "SETNAME"], "-ERR wrong number of arguments for 'client|setname' command"),
        (&["CLIENT", "GETNAME", "x"], "-ERR wrong number of arguments for 'client|getname' command"),
        (&["CLIENT", "ID", "x"], "-ERR wrong number of arguments for 'client|id' command"),
        (&["CLIENT", "SETINFO", "lib-name"], "-ERR wrong number of arguments for 'client|setinfo' command"),
        (&["CONFIG"], "-ERR wrong number of arguments for 'config' command"),
        (&["CONFIG", "GET"], "-ERR wrong number of arguments for 'config|get' command"),
    ];
    check_all(&mut con, cases);
    server.stop().await;
}

/// What the client commands answer besides their arity: each names what it refuses, and the
/// commands libraries send still pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_commands_name_what_they_refuse() {
    let server = Server::start(common::manual_config()).await;
    let mut con = Conn::open(&server);
    let cases: &[(&[&str], &str)] = &[
        (&["SELECT", "0"], "+OK"),
        (&["SELECT", "1"], "-ERR DB index is out of range: tollgate has one keyspace (SELECT 0)"),
        (&["CLIENT", "SETNAME", "me"], "+OK"),
        (&["CLIENT", "SETINFO", "lib-name", "redis-rs"], "+OK"),
        (&["CLIENT", "GETNAME"], "(nil)"),
        (&["CLIENT", "ID"], ":1"),
        (
            &["CLIENT", "KILL", "x"],
            "-ERR unknown subcommand 'KILL' for 'client'; subcommands: SETNAME, SETINFO, GETNAME, ID",
        ),
        (&["CONFIG", "GET", "save", "appendonly"], "[\"save\", \"\", \"appendonly\", \"no\"]"),
        (&["CONFIG", "GET", "maxmemory"], "[]"),
        (&["CONFIG", "SET", "x", "y"], "-ERR tollgate has no configuration to change at run time (CONFIG SET)"),
        (&["HELLO", "3"], "-NOPROTO this server speaks RESP2 only"),
        (&["HELLO", "2", "FOO"], "-ERR Syntax error in HELLO option 'FOO'"),
        (&["HELLO", "2", "AUTH", "u", "p"], "-ERR tollgate has no authentication: connect without AUTH"),
    ];
    check_all(&mut con, cases);
    assert!(con.ask(&["HELLO", "2", "SETNAME", "me"]).starts_with("[\"server\", \"tollgate\""));
    // On the wire, no name is RESP2's null bulk string, as Redis answers (not `$0`, a name "").
    let (reply, closed) = raw(&server, b"*2\r\n$6\r\nCLIENT\r\n$7\r\nGETNAME\r\n*1\r\n$4\r\nQUIT\r\n");
    assert_eq!((reply.as_str(), closed), ("$-1\r\n+OK\r\n", true));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn options_are_checked_by_name_for_each_command() {
    let server = Server::start(with_rules("[limits.api]\nlimit = \"5/1m\"\n")).await;
    let mut con = Conn::open(&server);
    let (check, peek, reset, limit) = (
        &["TG.CHECK", "k", "gcra", "10", "1000"][..],
        &["TG.PEEK", "k", "gcra", "10", "1000"][..],
        &["TG.RESET", "k", "gcra", "10", "1000"][..],
        &["TG.LIMIT", "api", "k"][..],
    );
    let with = |head: &[&'static str], tail: &[&'static str]| -> Vec<&'static str> { [head, tail].concat() };
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (with(peek, &["COST", "3"]), "-ERR TG.PEEK takes no COST (a peek never consumes); options: BURST, SLICES, TZ"),
        (with(peek, &["cost", "3"]), "-ERR TG.PEEK takes no COST (a peek never consumes); options: BURST, SLICES, TZ"),
        (
            with(reset, &["COST", "3"]),
            "-ERR TG.RESET takes no COST (a reset consumes nothing); options: BURST, SLICES, TZ",
        ),
        (with(check, &["FOO", "1"]), "-ERR unknown option FOO for TG.CHECK; options: BURST, SLICES, COST, TZ"),
        (with(peek, &["FOO", "1"]), "-ERR unknown option FOO for TG.PEEK; options: BURST, SLICES, TZ"),
        (with(reset, &["FOO", "1"]), "-ERR unknown option FOO for TG.RESET; options: BURST, SLICES, TZ"),
        (with(limit, &["FOO", "1"]), "-ERR unknown option FOO for TG.LIMIT; options: COST"),
        (
            with(limit, &["BURST", "3"]),
            "-ERR TG.LIMIT takes no BURST (the limit's parameters are in the rules file); options: COST",
        ),
        (with(check, &["BURST", "2", "burst", "3"]), "-ERR BURST given twice to TG.CHECK"),
        (with(check, &["COST", "1", "COST", "2"]), "-ERR COST given twice to TG.CHECK"),
        (with(limit, &["COST", "1", "COST", "2"]), "-ERR COST given twice to TG.LIMIT"),
        (with(check, &["COST"]), "-ERR COST needs a value: TG.CHECK ... COST <c>"),
        (with(check, &["BURST", "2", "SLICES"]), "-ERR SLICES needs a value: TG.CHECK ... SLICES <s>"),
        (with(limit, &["COST"]), "-ERR COST needs a value: TG.LIMIT ... COST <c>"),
        (with(check, &["FOO"]), "-ERR unknown option FOO for TG.CHECK; options: BURST, SLICES, COST, TZ"),
        (with(peek, &["COST"]), "-ERR TG.PEEK takes no COST (a peek never consumes); options: BURST, SLICES, TZ"),
    ];
    for (args, wanted) in &cases {
        assert_eq!(con.ask(args), *wanted, "{args:?}");
    }
    // Arguments are read before options: a missing period is named, not taken for an option.
    assert_eq!(
        con.ask(&["TG.CHECK", "k", "gcra", "10", "BURST", "5"]),
        "-ERR period_ms must be an integer, got BURST (or day, week, month, year)"
    );
    assert_eq!(con.ask(&with(check, &["BURST", "x"])), "-ERR BURST must be an integer, got x");
    // The options that are taken still work, in any case and order.
    assert_eq!(con.ask(&with(check, &["cost", "2", "Burst", "4"])), "[:1, :4, :2, :0, :200]");
    assert_eq!(con.ask(&with(peek, &["BURST", "4"])), "[:1, :4, :2, :0, :200]");
    assert_eq!(con.ask(&with(limit, &["COST", "2"])), "[:1, :5, :3, :0, :24000]");
    server.stop().await;
}

/// An ad-hoc limit per calendar period: `TG.CHECK k fixed-window 2 month TZ Europe/Berlin`
/// decides as the rules file's `limit = "2/month"`, `tz = "Europe/Berlin"` (the same reply,
/// its reset at Berlin's next first of the month); `TG.PEEK` and `TG.RESET` take it too, and what
/// a calendar period cannot be is refused in the limit's words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_calendar_period_is_taken_in_place_of_milliseconds() {
    let server = Server::start(with_rules(
        "[limits.monthly]\nlimit = \"2/month\"\nalgorithm = \"sliding-window\"\ntz = \"Europe/Berlin\"\n",
    ))
    .await;
    let mut con = Conn::open(&server);
    let adhoc = ["TG.CHECK", "a", "sliding-window", "2", "Month", "TZ", "Europe/Berlin"];
    for _ in 0..3 {
        assert_eq!(con.ask(&adhoc), con.ask(&["TG.LIMIT", "monthly", "n"]));
    }
    assert_eq!(
        con.ask(&["TG.PEEK", "a", "sliding-window", "2", "month", "TZ", "Europe/Berlin"]),
        con.ask(&["TG.LIMIT", "monthly", "n", "COST", "0"])
    );
    assert_eq!(con.ask(&["TG.RESET", "a", "sliding-window", "2", "month", "tz", "Europe/Berlin"]), "+OK");
    assert!(con.ask(&adhoc).starts_with("[:1, :2, :1,"), "reset");
    // UTC unless a zone is named: its month ends at another instant than Berlin's.
    let utc = con.ask(&["TG.CHECK", "u", "fixed-window", "2", "month"]);
    let berlin = con.ask(&["TG.CHECK", "b", "fixed-window", "2", "month", "TZ", "Europe/Berlin"]);
    let fresh = "[:1, :2, :1, :0, :";
    assert!(utc.starts_with(fresh) && berlin.starts_with(fresh) && utc != berlin, "{utc} {berlin}");
    for (args, wanted) in [
        (&["TG.CHECK", "k", "gcra", "2", "month"][..], "calendar"),
        (&["TG.CHECK", "k", "fixed-window", "2", "1000", "TZ", "Europe/Berlin"], "not to a fixed length"),
        (&["TG.CHECK", "k", "fixed-window", "2", "month", "TZ", "Mars/Olympus"], "Mars/Olympus"),
        (&["TG.CHECK", "k", "fixed-window", "2", "month", "TZ", "UTC", "TZ", "UTC"], "TZ given twice"),
        (&["TG.LIMIT", "monthly", "k", "TZ", "UTC"], "TG.LIMIT takes no TZ"),
        (&["TG.CHECK", "k", "fixed-window", "2", "fortnight"], "period_ms must be an integer, got fortnight (or day"),
    ] {
        let reply = con.ask(args);
        assert!(reply.starts_with("-ERR") && reply.contains(wanted), "{args:?}: {reply}");
    }
    let long = "Z".repeat(65);
    let reply = con.ask(&["TG.CHECK", "k", "fixed-window", "2", "month", "TZ", &long]);
    assert!(reply.starts_with("-ERR TZ must be an IANA time zone name (at most 64 bytes)"), "{reply}");
    assert_eq!(con.ask(&["PING"]), "+PONG", "the connection goes on");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_limit_says_what_the_server_has() {
    let none = Server::start(common::manual_config()).await;
    assert_eq!(
        Conn::open(&none).ask(&["TG.LIMIT", "api", "k"]),
        "-ERR no rule or limit named \"api\": the server was started without --rules FILE"
    );
    none.stop().await;

    let some = Server::start(with_rules(
        "[[rules]]\nname = \"by-ip\"\nlimit = \"5/1m\"\nkey = [\"client_ip\"]\n\n\
         [limits.search]\nlimit = \"5/1m\"\n[limits.api]\nlimit = \"5/1m\"\n",
    ))
    .await;
    let mut con = Conn::open(&some);
    assert_eq!(
        con.ask(&["TG.LIMIT", "apj", "k"]),
        "-ERR no rule or limit named \"apj\"; limits usable by name: api, search"
    );
    // A rule that is there but not keyed on the caller's key keeps the engine's own message.
    assert!(con.ask(&["TG.LIMIT", "by-ip", "k"]).contains("keys on request characteristics"));
    some.stop().await;

    let unnamed =
        Server::start(with_rules("[[rules]]\nname = \"by-ip\"\nlimit = \"5/1m\"\nkey = [\"client_ip\"]\n")).await;
    assert_eq!(
        Conn::open(&unnamed).ask(&["TG.LIMIT", "api", "k"]),
        "-ERR no rule or limit named \"api\"; no limit is usable by name (define [limits.NAME], or a rule with key = [\"key\"])"
    );
    unnamed.stop().await;
}

/// Before: the bound was checked against each argument's end, not the command's (two bytes over it
/// passed), and inline commands were bounded by `max_inline_bytes` alone: with a 20-byte bound a
/// 60-byte command typed by hand was run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_frame_bytes_bounds_whole_commands() {
    let resp = RespBounds { max_frame_bytes: 20, ..RespBounds::default() };
    let server = Server::start(Config { resp, ..common::manual_config() }).await;
    let refused = "-ERR Protocol error: command larger than 20 bytes (--max-frame-bytes)\r\n";
    let inline = b"CL.THROTTLE user:123456789012345678901234567890 15 30 60 1\r\n";
    assert_eq!(inline.len(), 60);
    for bytes in [
        &inline[..],
        // 21 bytes inline, and 22 as an array (its last argument ends at byte 20).
        b"ECHO aaaaaaaaaaaaaa\r\n",
        b"*2\r\n$4\r\nECHO\r\n$2\r\nhi\r\n",
        // Refused from the declared count alone: 9 arguments cannot fit in 20 bytes.
        b"*9\r\n",
        // Refused from a declared length, before its data is sent.
        b"*2\r\n$4\r\nECHO\r\n$3\r\n",
    ] {
        let (reply, closed) = raw(&server, bytes);
        assert_eq!(reply, refused, "{:?}", String::from_utf8_lossy(bytes));
        assert!(closed, "the connection is closed after the error");
    }
    // At the bound exactly: served, and commands under it pipelined in one write too.
    let mut con = Conn::open(&server);
    assert_eq!(con.reply_to(b"ECHO aaaaaaaaaaaaa\r\n"), "\"aaaaaaaaaaaaa\"");
    assert_eq!(con.reply_to(b"*2\r\n$4\r\nECHO\r\n$0\r\n\r\n*1\r\n$4\r\nPING\r\n"), "\"\"");
    assert_eq!(con.reply(), "+PONG");
    // Other clients are unaffected.
    assert_eq!(Conn::open(&server).reply_to(b"PING\r\n"), "+PONG");
    server.stop().await;
}

impl Conn {
    fn reply_to(&mut self, bytes: &[u8]) -> String {
        self.reader.get_mut().write_all(bytes).unwrap();
        self.reply()
    }
}
