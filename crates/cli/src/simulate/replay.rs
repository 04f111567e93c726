//! Trace replay: JSON lines in, one JSON decision per request out, each key with its own state.
//!
//! Input lines are `{"t": <u64 ns since the epoch>, "key": "<string>", "cost": <u64, default 1>}`;
//! other fields (such as a conformance file's `expect`) are ignored, blank lines are not requests.
//! Any other problem — bad JSON, a missing or mistyped field, `t` going backwards, a cost the limit
//! can never admit — stops the replay with `line N: problem`, after every decision before it has
//! been written out.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::path::Path;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use tollgate_core::{Decision, Limit, State};

/// One request of a trace.
#[derive(Debug, Deserialize)]
struct Request {
    t: u64,
    key: String,
    #[serde(default = "unit_cost")]
    cost: u64,
}

fn unit_cost() -> u64 {
    1
}

/// One decision, serialized in exactly this field order.
#[derive(Debug, Serialize)]
struct Output {
    allowed: bool,
    limit: u64,
    remaining: u64,
    retry_after_ns: u64,
    reset_after_ns: u64,
}

impl From<Decision> for Output {
    fn from(d: Decision) -> Self {
        Output {
            allowed: d.allowed,
            limit: d.limit,
            remaining: d.remaining,
            retry_after_ns: d.retry_after_ns,
            reset_after_ns: d.reset_after_ns,
        }
    }
}

/// Replays the trace at `path` (`-` for stdin) under `limit`, writing decisions to stdout.
pub(crate) fn run(limit: &Limit, path: &Path) -> anyhow::Result<()> {
    let input: Box<dyn BufRead> = if path == Path::new("-") {
        Box::new(io::stdin().lock())
    } else {
        let file = File::open(path).with_context(|| format!("cannot open trace {}", path.display()))?;
        Box::new(BufReader::new(file))
    };
    let mut out = BufWriter::new(io::stdout().lock());
    let result = replay(limit, input, &mut out);
    // Decisions made before a bad line are part of the answer: flush them before reporting.
    let flushed = out.flush().context("cannot write decisions");
    result.and(flushed)
}

/// Decides every request read from `input`, writing one JSON line per request to `out`.
fn replay(limit: &Limit, input: impl BufRead, out: &mut impl Write) -> anyhow::Result<()> {
    let mut states: HashMap<String, State> = HashMap::new();
    let mut previous_t = 0;
    for (index, line) in input.lines().enumerate() {
        let number = index + 1;
        let line = line.with_context(|| format!("line {number}: cannot read"))?;
        if line.trim().is_empty() {
            continue;
        }
        let request = parse(&line).with_context(|| format!("line {number}"))?;
        if request.t < previous_t {
            bail!(
                "line {number}: t {} is before the previous request's t {previous_t} (t must not decrease)",
                request.t
            );
        }
        previous_t = request.t;
        let state = states.entry(request.key).or_insert_with(|| State::idle(limit));
        let decision = state.check(request.t, limit, request.cost).with_context(|| format!("line {number}"))?;
        serde_json::to_writer(&mut *out, &Output::from(decision)).context("cannot write decisions")?;
        out.write_all(b"\n").context("cannot write decisions")?;
    }
    Ok(())
}

/// Parses one request, with serde's message minus its "at line 1 column N" (always line 1 here).
fn parse(line: &str) -> anyhow::Result<Request> {
    serde_json::from_str(line).map_err(|error| {
        let message = error.to_string();
        let message = message.split(" at line ").next().unwrap_or(&message);
        anyhow::anyhow!("{message} (column {})", error.column())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::Algorithm;

    fn run_text(limit: &str, algorithm: Algorithm, input: &str) -> (String, anyhow::Result<()>) {
        let limit = limit.parse::<tollgate_core::LimitBuilder>().unwrap().algorithm(algorithm).build().unwrap();
        let mut out = Vec::new();
        let result = replay(&limit, input.as_bytes(), &mut out);
        (String::from_utf8(out).unwrap(), result)
    }

    #[test]
    fn prints_one_exact_line_per_request() {
        let (out, result) = run_text(
            "10/s",
            Algorithm::Gcra,
            "{\"t\":1700000000000000000,\"key\":\"a\"}\n\n{\"t\":1700000000000000000,\"key\":\"a\",\"cost\":0,\"expect\":{}}\n",
        );
        result.unwrap();
        assert_eq!(
            out,
            "{\"allowed\":true,\"limit\":10,\"remaining\":9,\"retry_after_ns\":0,\"reset_after_ns\":100000000}\n\
             {\"allowed\":true,\"limit\":10,\"remaining\":9,\"retry_after_ns\":0,\"reset_after_ns\":100000000}\n"
        );
    }

    #[test]
    fn bad_lines_name_their_number_and_keep_earlier_output() {
        let ok = "{\"t\":5,\"key\":\"a\"}\n";
        for (bad, wanted) in [
            ("{\"t\":4,\"key\":\"a\"}", "line 2: t 4 is before the previous request's t 5"),
            ("{\"t\":6}", "line 2: missing field `key`"),
            ("{\"t\":-1,\"key\":\"a\"}", "line 2: invalid value: integer `-1`, expected u64"),
            ("{\"t\":6.5,\"key\":\"a\"}", "line 2: invalid type: floating point `6.5`, expected u64"),
            ("{\"t\":6,\"key\":7}", "line 2: invalid type: integer `7`, expected a string"),
            ("{\"t\":6,\"key\":\"a\",\"cost\":11}", "line 2: cost 11 exceeds the capacity 10"),
            ("not json", "line 2: expected ident"),
        ] {
            let (out, result) = run_text("10/s", Algorithm::FixedWindow, &format!("{ok}{bad}\n{ok}"));
            let message = format!("{:#}", result.unwrap_err());
            assert!(message.starts_with(wanted), "{bad}: {message}");
            assert_eq!(out.lines().count(), 1, "the first decision is still written");
        }
    }

    #[test]
    fn keys_are_independent() {
        let (out, result) = run_text(
            "1/s",
            Algorithm::SlidingLog,
            "{\"t\":1,\"key\":\"a\"}\n{\"t\":1,\"key\":\"b\"}\n{\"t\":1,\"key\":\"a\"}\n",
        );
        result.unwrap();
        let allowed: Vec<bool> = out
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["allowed"].as_bool().unwrap())
            .collect();
        assert_eq!(allowed, [true, true, false]);
    }
}
