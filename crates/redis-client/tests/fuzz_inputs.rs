//! Inputs through this crate's fuzz targets' own bodies (`tollgate_redis_client::fuzzing`): every
//! crashing input ever committed to `fuzz/regressions/TARGET/` (`redis_topology`, `redis_url`),
//! and inputs written by hand at the edges each target guards (a panic or a broken invariant
//! fails the test).

use std::path::Path;

use tollgate_redis_client::fuzzing;
use tollgate_redis_client::testkit::urls::CORPUS;

/// The committed inputs of `target`, with their file names.
fn regressions(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/regressions").join(target);
    let Ok(entries) = std::fs::read_dir(&dir) else { return Vec::new() };
    let mut inputs: Vec<(String, Vec<u8>)> = entries
        .map(|entry| {
            let path = entry.expect("a directory entry").path();
            let bytes = std::fs::read(&path).expect("a regression input");
            (path.display().to_string(), bytes)
        })
        .collect();
    inputs.sort();
    inputs
}

fn each(target: &str, by_hand: &[&[u8]], run: impl Fn(&[u8])) {
    for input in by_hand {
        run(input);
    }
    for (name, bytes) in regressions(target) {
        eprintln!("{target}: {name}");
        run(&bytes);
    }
}

#[test]
fn redis_topology_inputs() {
    let many_ranges = {
        let mut reply = b"*16385\r\n".to_vec();
        for slot in 0..16_385 {
            reply.extend(format!("*3\r\n:{slot}\r\n:{slot}\r\n*2\r\n$1\r\nh\r\n:1\r\n").as_bytes());
        }
        reply
    };
    let by_hand: &[&[u8]] = &[
        b"",
        b"*0\r\n",
        b"-MOVED 20000 127.0.0.1:1\r\n",
        b"-ASK 16384 127.0.0.1:1\r\n",
        b"-MOVED 1 127.0.0.1:0\r\n",
        b"-MOVED -1 [::1]:7000\r\n",
        b"-MOVED 1 [::1\r\n",
        b"-MOVED 1\r\n",
        b"-MOVED\r\n",
        b"*99999999999999\r\n",
        b"$9999999999\r\n",
        b"*1\r\n*3\r\n:0\r\n:16384\r\n*2\r\n$1\r\nh\r\n:1\r\n",
        b"*1\r\n*3\r\n:5\r\n:1\r\n*2\r\n$1\r\nh\r\n:1\r\n",
        b"*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$0\r\n\r\n:65536\r\n",
        b"*1\r\n*4\r\n:0\r\n:16383\r\n*2\r\n$1\r\n?\r\n:1\r\n*2\r\n$3\r\na b\r\n:2\r\n",
        b"*2\r\n*3\r\n:0\r\n:9\r\n*2\r\n$1\r\nh\r\n:1\r\n*3\r\n:9\r\n:16383\r\n*2\r\n$1\r\nh\r\n:2\r\n",
        b"*2\r\n$9\r\n127.0.0.1\r\n$1\r\n0\r\n",
        b"*2\r\n$9\r\n127.0.0.1\r\n$20\r\n18446744073709551616\r\n",
        b"*2\r\n$9\r\n127.0.0.1\r\n:-1\r\n",
        b"*1\r\n$5\r\nslave\r\n",
        b"*1\r\n$6\r\nleader\r\n",
        b"%1\r\n+k\r\n:1\r\n",
        b">2\r\n+message\r\n+x\r\n*0\r\n",
        &b"*1\r\n".repeat(200),
        &many_ranges,
    ];
    each("redis_topology", by_hand, |input| {
        let _ = fuzzing::redis_topology(input);
    });
}

#[test]
fn redis_url_inputs() {
    let mut by_hand: Vec<&[u8]> = CORPUS.iter().map(|(url, _)| url.as_bytes()).collect();
    let long = format!("redis+cluster://{}", vec!["h:1"; 2_000].join(","));
    by_hand.extend([
        &b""[..],
        b"redis://",
        b"redis://h",
        b"rediss://[::1]:6380/15",
        b"redis://[fe80::1%eth0]:6379",
        b"redis+sentinel://s1,s2:26380/my%20master/4",
        b"redis+sentinel://s1/%",
        b"redis+sentinel://s1/%00",
        b"redis://:%FF@h",
        b"redis://u:p@h:65535/4294967295",
        b"redis://u:p@h:65535/4294967296",
        b"redis+cluster://a:1,,b:2",
        b"redis://\xff\xfe@h",
        long.as_bytes(),
    ]);
    each("redis_url", &by_hand, fuzzing::redis_url);
}
