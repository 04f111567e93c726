//! A client's pipelined commands answer what the same commands sent one by one answer, in the
//! same order: on Redis, decisions on different keys received together are decided together
//! (`resp/batch.rs`), and a repeated key, a reset, a named limit, an administrative command, an
//! error or a command cut across two writes must each still come in its turn. Each pipeline runs
//! twice on keys of their own: once sent whole, once command by command (waiting for each reply),
//! on the memory store and on Redis. Limits refill once in 10⁶ s: no refill falls between the two
//! runs, so every decision's verdict, limit and remaining must be equal.

mod common;

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::Server;
use tollgate_resp::Value;
use tollgate_server::{Config, StoreConfig};
use tollgate_store::testkit::redis_server::RedisServer;

/// A reply as compared: a decision's first three fields (verdict, limit, remaining) and whether it
/// has a retry time (Redis's clock moves between the runs: the times may differ by a second's
/// rounding), anything else whole, with the run's key prefix (quoted by some errors) as `{k}`.
fn comparable(reply: &Value, prefix: &str) -> String {
    match reply.integers() {
        Some(values) if values.len() == 5 => format!("{:?} retry={}", &values[..3], values[3] >= 0),
        _ => format!("{reply:?}").replace(&format!("{prefix}:"), "{k}"),
    }
}

/// `commands`, their `{k}` made `prefix:`, encoded one after the other.
fn encoded(commands: &[Vec<String>], prefix: &str) -> Vec<Vec<u8>> {
    commands
        .iter()
        .map(|command| {
            let args: Vec<String> = command.iter().map(|a| a.replace("{k}", &format!("{prefix}:"))).collect();
            let mut bytes = Vec::new();
            tollgate_resp::command::encode(&args, &mut bytes);
            bytes
        })
        .collect()
}

fn connect(server: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(server).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream
}

/// The replies to `commands` (keyed under `prefix`) written in pieces cut at `cuts` (byte
/// offsets into the whole).
fn pipelined(server: SocketAddr, commands: &[Vec<u8>], prefix: &str, cuts: &[usize]) -> Vec<String> {
    let mut stream = connect(server);
    let whole: Vec<u8> = commands.concat();
    let mut from = 0;
    for &cut in cuts.iter().chain([&whole.len()]) {
        let cut = cut.clamp(from, whole.len());
        stream.write_all(&whole[from..cut]).unwrap();
        stream.flush().unwrap();
        from = cut;
    }
    let mut reader = BufReader::new(stream);
    commands.iter().map(|_| comparable(&tollgate_resp::value::read(&mut reader).unwrap(), prefix)).collect()
}

/// The replies to `commands` (keyed under `prefix`), each sent once the previous one is answered.
fn one_by_one(server: SocketAddr, commands: &[Vec<u8>], prefix: &str) -> Vec<String> {
    let stream = connect(server);
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    commands
        .iter()
        .map(|command| {
            writer.write_all(command).unwrap();
            comparable(&tollgate_resp::value::read(&mut reader).unwrap(), prefix)
        })
        .collect()
}

fn words(line: &str) -> Vec<String> {
    line.split_whitespace().map(str::to_string).collect()
}

/// A mixed pipeline: fresh keys decided together, a key repeated until it is denied, errors in
/// the middle (bad arguments, an unknown command, an unknown limit), a reset then a decision on
/// the reset key, peeks, a named limit, administrative commands.
fn mixed() -> Vec<Vec<String>> {
    [
        "CL.THROTTLE {k}a 1 1 1000000",
        "CL.THROTTLE {k}b 1 1 1000000",
        "CL.THROTTLE {k}a 1 1 1000000",
        "CL.THROTTLE {k}a 1 1 1000000",
        "TG.CHECK {k}c gcra 2 1000000000000",
        "CL.THROTTLE {k}d x 1 1000000",
        "TG.PEEK {k}a gcra 1 1000000000 BURST 2",
        "CL.THROTTLE {k}e 0 1 1000000 5",
        "NOSUCH {k}a",
        "TG.CHECK {k}f fixed-window 3 1000000000000 COST 2",
        "TG.CHECK {k}f fixed-window 3 1000000000000 COST 2",
        "PING",
        "TG.RESET {k}b gcra 1 1000000000 BURST 2",
        "CL.THROTTLE {k}b 1 1 1000000",
        "TG.CHECK {k}g gcra 2 1000000000000 NOPE 1",
        "TG.LIMIT api {k}h",
        "TG.LIMIT nosuch {k}h",
        "ECHO hello",
        "CL.THROTTLE {k}i 0 1 1000000",
        "CL.THROTTLE {k}j 0 1 1000000",
        "CL.THROTTLE {k}i 0 1 1000000",
        "TG.CHECK {k}k sliding-window 2 1000000000000",
        "TG.CHECK {k}k sliding-window 2 1000000000000",
        "TG.CHECK {k}k sliding-window 2 1000000000000",
    ]
    .iter()
    .map(|line| words(line))
    .collect()
}

/// A pseudo-random pipeline of `length` decisions on 6 keys (so keys repeat), a reset, a peek or
/// an error now and then.
fn random(seed: u64, length: usize) -> Vec<Vec<String>> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move |bound: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % bound
    };
    (0..length)
        .map(|_| {
            let key = format!("{{k}}{}", next(6));
            let line = match next(10) {
                0 => format!("TG.RESET {key} gcra 3 1000000000000"),
                1 => format!("TG.PEEK {key} gcra 3 1000000000000"),
                2 => format!("CL.THROTTLE {key} 2 3 notanumber"),
                3 => "PING".to_string(),
                4 | 5 => format!("TG.CHECK {key} gcra 3 1000000000000 COST {}", next(3)),
                _ => format!("CL.THROTTLE {key} 2 3 1000000 {}", next(3)),
            };
            words(&line)
        })
        .collect()
}

/// Every pipeline, sent whole and one by one (blocking I/O: on a thread of its own).
fn the_same_either_way(server: SocketAddr, store: &str) {
    let mut runs: Vec<(String, Vec<Vec<String>>)> = vec![("mixed".into(), mixed())];
    for seed in 0..40 {
        runs.push((format!("random {seed}"), random(seed, 40)));
    }
    for (index, (name, commands)) in runs.iter().enumerate() {
        let (whole, single) = (format!("p{index}"), format!("s{index}"));
        let pipelined_commands = encoded(commands, &whole);
        let total: usize = pipelined_commands.iter().map(Vec::len).sum();
        // Cut in the middle of commands too (a third and two thirds in): a command split across
        // two reads waits for its rest, in its place.
        let cuts = if index % 2 == 0 { vec![] } else { vec![total / 3, 2 * total / 3] };
        let got = pipelined(server, &pipelined_commands, &whole, &cuts);
        let want = one_by_one(server, &encoded(commands, &single), &single);
        for (at, (got, want)) in got.iter().zip(&want).enumerate() {
            assert_eq!(got, want, "{store}, {name}, command {at} {:?}: pipelined vs one by one", commands[at]);
        }
    }
}

fn config(store: StoreConfig) -> Config {
    let rules = tollgate_rules::Rules::parse("[limits.api]\nlimit = \"2/1000000s\"\n", "pipeline").unwrap();
    Config { store, rules, ..common::manual_config() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_commands_answer_as_one_by_one_on_redis() {
    let redis = RedisServer::start();
    let server = Server::start(config(StoreConfig::redis(&redis.url()))).await;
    let resp = server.resp;
    tokio::task::spawn_blocking(move || the_same_either_way(resp, "redis")).await.unwrap();
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_commands_answer_as_one_by_one_in_memory() {
    let server = Server::start(config(StoreConfig::Memory { max_keys: 10_000, max_memory: 64 << 20 })).await;
    let resp = server.resp;
    tokio::task::spawn_blocking(move || the_same_either_way(resp, "memory")).await.unwrap();
    server.stop().await;
}

/// Redis's count of reads it has processed (`INFO stats`: one per read event on any connection).
async fn reads_processed(redis: &redis::Client) -> u64 {
    let mut connection = redis.get_multiplexed_async_connection().await.unwrap();
    let info: String = redis::cmd("INFO").arg("stats").query_async(&mut connection).await.unwrap();
    let line = info.lines().find_map(|l| l.strip_prefix("total_reads_processed:")).expect("total_reads_processed");
    line.trim().parse().unwrap()
}

/// 32 decisions on different keys pipelined in one write reach Redis together: before, one after
/// another, each was a round trip of its own (32 reads at Redis at least).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_decisions_on_different_keys_reach_redis_together() {
    let redis = RedisServer::start();
    let lease = tollgate_server::LeaseOptions { mode: tollgate_server::LeaseMode::Off, ..Default::default() };
    let config = Config { lease, ..config(StoreConfig::redis(&redis.url())) };
    let server = Server::start(config).await;
    let resp = server.resp;
    let client = redis::Client::open(redis.url()).unwrap();
    let commands: Vec<Vec<String>> = (0..32).map(|i| words(&format!("CL.THROTTLE {{k}}{i} 5 10 60"))).collect();
    // The script loaded and the connection made first.
    let warm = encoded(&commands[..1], "warm");
    tokio::task::spawn_blocking(move || one_by_one(resp, &warm, "warm")).await.unwrap();
    let before = reads_processed(&client).await;
    let pipeline = encoded(&commands, "together");
    let replies = tokio::task::spawn_blocking(move || pipelined(resp, &pipeline, "together", &[])).await.unwrap();
    // One read for INFO itself, a probe a second at most besides.
    let reads = reads_processed(&client).await - before;
    assert!(replies.iter().all(|r| r == "[0, 6, 5] retry=false"), "{replies:?}");
    assert!(reads < 16, "Redis read {reads} times for 32 pipelined decisions");
    server.stop().await;
}

/// A command cut across two reads, seen by the look-ahead while half received, must not stop
/// batching on that connection: the look-ahead decoder keeps the half-framed command's state
/// (`expected`, `at`, its first arguments) and, never told the bytes moved, resumes framing at
/// that offset in every later slice it is given; with commands of one shape that offset never
/// frames, and every later pipeline of decisions is run one by one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_cut_across_reads_does_not_stop_batching_on_its_connection() {
    let redis = RedisServer::start();
    let lease = tollgate_server::LeaseOptions { mode: tollgate_server::LeaseMode::Off, ..Default::default() };
    let config = Config { lease, ..config(StoreConfig::redis(&redis.url())) };
    let server = Server::start(config).await;
    let resp = server.resp;
    let client = redis::Client::open(redis.url()).unwrap();
    let (before, after) = tokio::task::spawn_blocking(move || cut_then_pipelines(resp, &client)).await.unwrap();
    assert!(before < 16, "Redis read {before} times for 32 pipelined decisions before the cut");
    assert!(after.iter().all(|&r| r < 16), "Redis reads per 32 pipelined decisions after a cut command: {after:?}");
    server.stop().await;
}

/// On one connection: a pipeline of 32 decisions on fresh keys, a decision and one cut past its
/// key (the look-ahead sees it half received), then three such pipelines; Redis's reads for each.
fn cut_then_pipelines(resp: SocketAddr, client: &redis::Client) -> (u64, Vec<u64>) {
    let redis_reads = || tokio::runtime::Handle::current().block_on(reads_processed(client));
    let stream = connect(resp);
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    // The script loaded and the connection made first.
    let warm = encoded(&[words("CL.THROTTLE {k}warm 5 10 60")], "cut");
    writer.write_all(&warm[0]).unwrap();
    tollgate_resp::value::read(&mut reader).unwrap();
    let pipeline = |round: usize, writer: &mut TcpStream, reader: &mut BufReader<TcpStream>| {
        let commands: Vec<Vec<String>> =
            (0..32).map(|i| words(&format!("CL.THROTTLE {{k}}r{round}:{i:02} 5 10 60"))).collect();
        let before = redis_reads();
        writer.write_all(&encoded(&commands, "cut").concat()).unwrap();
        let replies: Vec<Value> = (0..32).map(|_| tollgate_resp::value::read(reader).unwrap()).collect();
        assert!(replies.iter().all(|r| r.integers().is_some_and(|v| v[0] == 0)), "{replies:?}");
        redis_reads() - before
    };
    let before = pipeline(0, &mut writer, &mut reader);
    // The rest of the cut command follows once the first is answered.
    let long = format!("CL.THROTTLE {{k}}{} 5 10 60 1", "b".repeat(50));
    let two = encoded(&[words("CL.THROTTLE {k}a 5 10 60"), words(&long)], "cut").concat();
    let (head, tail) = two.split_at(two.len() - 20);
    writer.write_all(head).unwrap();
    tollgate_resp::value::read(&mut reader).unwrap();
    writer.write_all(tail).unwrap();
    tollgate_resp::value::read(&mut reader).unwrap();
    (before, (1..4).map(|round| pipeline(round, &mut writer, &mut reader)).collect())
}

/// The look-ahead keeps what it framed of a command cut across reads (here the name of a
/// `CL.THROTTLE` whose key is still to come) and adds the next slice's arguments to it: an inline
/// command followed by a short one then frames as arguments ranging past that slice's end, and
/// taking the "name" out of it panicked (`range start index 9 out of range for slice of length
/// 6`, `resp/batch.rs`): the connection closed without its replies, and the RESP connections
/// gauge kept it counted for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_cut_after_its_name_then_short_inline_commands_are_answered() {
    let redis = RedisServer::start();
    let server = Server::start(config(StoreConfig::redis(&redis.url()))).await;
    let resp = server.resp;
    let replies = tokio::task::spawn_blocking(move || {
        let stream = connect(resp);
        let mut writer = stream.try_clone().unwrap();
        let mut reader = BufReader::new(stream);
        let mut reply = || {
            tollgate_resp::value::read(&mut reader).map_or_else(|e| format!("no reply: {e}"), |v| comparable(&v, "cut"))
        };
        let two = encoded(&[words("CL.THROTTLE {k}a 5 10 60"), words("CL.THROTTLE {k}b 5 10 60")], "cut").concat();
        // The second command cut inside its key (the look-ahead has framed its name).
        let cut = two.len() / 2 + "*5\r\n$11\r\nCL.THROTTLE\r\n$5\r\nc".len();
        writer.write_all(&two[..cut]).unwrap();
        let mut replies = vec![reply()];
        writer.write_all(&two[cut..]).unwrap();
        replies.push(reply());
        writer.write_all(b"CL.THROTTLE cut:c 5 10 60\r\nPING\r\n").unwrap();
        replies.push(reply());
        replies.push(reply());
        replies
    })
    .await
    .unwrap();
    let decision = "[0, 6, 5] retry=false";
    assert_eq!(replies, [decision, decision, decision, "Simple(\"PONG\")"]);
    server.stop().await;
}
