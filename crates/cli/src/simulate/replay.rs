//! Trace replay: JSON lines in, one JSON decision per request out, each key with its own state.
//!
//! The limit comes from the command line (`--algorithm`, `--limit`, ...) or from the trace's
//! first line, a params header (the conformance files' `{"params": {...}}`); see [`Flags`] for
//! how the two combine. The line formats are in [`trace`](super::trace). A bad line — bad JSON, an
//! unknown, missing or mistyped field, `t` going backwards, a cost the limit can never admit —
//! stops the replay with `line N: problem`, after every decision before it has been written out.
//!
//! With `--check`, every decision is also compared with its line's `expect` fields: each
//! difference is reported as `line N: expected FIELD WANTED, got ACTUAL` on stderr, then a
//! one-line verdict; any difference makes the run fail.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::path::Path;

use anyhow::{Context, bail};
use serde::Serialize;
use tollgate_core::{Decision, Limit, State};

use tollgate_core::trace;

/// The limit the command line gives, if any.
///
/// A trace whose first line is a params header carries its own limit, and the flags are then
/// not needed. Flags given as well must describe the same limit (`--limit 10/1s` for a header's
/// `10/s` is the same limit); any other combination — different values, or flags that are only
/// part of a limit, such as `--burst 3` alone — is an error naming both, because either choice
/// made silently would replay the trace under a limit the user did not mean. To replay a header's
/// requests under another limit, drop the header line (`tail -n +2 FILE`) and give the flags.
#[derive(Debug, Clone, Default)]
pub(crate) struct Flags {
    /// The limit built from the flags, when they give at least `--algorithm` and `--limit`.
    pub(crate) limit: Option<Limit>,
    /// The limit flags as given (`--algorithm gcra --limit 10/s`), if any was.
    pub(crate) given: Option<String>,
}

impl Flags {
    /// The command line's limit, for a trace without a header.
    fn require(&self) -> anyhow::Result<Limit> {
        if let Some(limit) = &self.limit {
            return Ok(limit.clone());
        }
        let header = r#"{"params": {"algorithm": "gcra", "limit": "10/s"}}"#;
        match &self.given {
            None => bail!(
                "no limit to decide under: give --algorithm and --limit (e.g. --algorithm gcra --limit 10/s), \
                 or make the trace's first line a params header such as {header}"
            ),
            Some(given) => bail!(
                "the command line gives {given} but not both --algorithm and --limit, and the trace has no \
                 params header: give --algorithm and --limit"
            ),
        }
    }

    /// The limit of a trace whose header (line `number`) sets `header`.
    fn with_header(&self, header: Limit, number: usize) -> anyhow::Result<Limit> {
        match (&self.given, &self.limit) {
            (None, _) => Ok(header),
            (Some(_), Some(flags)) if *flags == header => Ok(header),
            (Some(given), _) => bail!(
                "line {number}: the trace's params header sets {header}, and the command line sets {given}: \
                 give the limit in one place (drop the flags to use the header, or remove the header line \
                 to use the flags)"
            ),
        }
    }
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

/// What `--check` found.
#[derive(Debug, Default)]
struct Tally {
    /// Requests with at least one `expect` field.
    checked: u64,
    /// Requests without `expect` (or with an empty one).
    unchecked: u64,
    /// Checked requests whose decision differed in some field.
    failed: u64,
    /// One `line N: expected ..., got ...` per differing field.
    mismatches: Vec<String>,
}

impl Tally {
    fn record(&mut self, number: usize, expect: Option<&trace::Expect>, decision: &Decision) {
        let Some(expect) = expect.filter(|e| !e.is_empty()) else {
            self.unchecked += 1;
            return;
        };
        self.checked += 1;
        let mismatches = expect.mismatches(decision);
        if !mismatches.is_empty() {
            self.failed += 1;
        }
        self.mismatches.extend(mismatches.into_iter().map(|m| format!("line {number}: {m}")));
    }

    /// The one-line verdict: `Ok` (printed) when every checked decision matched.
    fn verdict(&self) -> anyhow::Result<String> {
        let unchecked = match self.unchecked {
            0 => String::new(),
            1 => "; 1 request without expect was not checked".into(),
            n => format!("; {n} requests without expect were not checked"),
        };
        if self.checked == 0 {
            bail!("--check: no request in the trace has an expect field, so nothing was checked");
        }
        if self.failed > 0 {
            bail!(
                "{} of {} checked did not match their expect fields{unchecked}",
                self.failed,
                decisions(self.checked)
            );
        }
        Ok(format!("checked {} against their expect fields: all match{unchecked}", decisions(self.checked)))
    }
}

fn decisions(n: u64) -> String {
    if n == 1 { "1 decision".into() } else { format!("{n} decisions") }
}

/// Replays the trace at `path` (`-` for stdin), writing decisions to stdout; with `check`, also
/// compares them with the trace's `expect` fields and reports on stderr.
pub(crate) fn run(flags: &Flags, path: &Path, check: bool) -> anyhow::Result<()> {
    let input: Box<dyn BufRead> = if path == Path::new("-") {
        Box::new(io::stdin().lock())
    } else {
        let file = File::open(path).with_context(|| format!("cannot open trace {}", path.display()))?;
        Box::new(BufReader::new(file))
    };
    let mut out = BufWriter::new(io::stdout().lock());
    let mut tally = check.then(Tally::default);
    let result = replay(flags, input, &mut out, tally.as_mut());
    // Decisions made before a bad line are part of the answer: flush them before reporting.
    let flushed = out.flush().context("cannot write decisions");
    drop(out);
    if let Some(tally) = &tally {
        // After the decisions, so that on a terminal the differences come last, in line order.
        for mismatch in &tally.mismatches {
            eprintln!("{mismatch}");
        }
    }
    result.and(flushed)?;
    if let Some(tally) = tally {
        eprintln!("{}", tally.verdict()?);
    }
    Ok(())
}

/// Decides every request read from `input`, writing one JSON line per request to `out`.
fn replay(
    flags: &Flags,
    input: impl BufRead,
    out: &mut impl Write,
    mut tally: Option<&mut Tally>,
) -> anyhow::Result<()> {
    let mut states: HashMap<String, State> = HashMap::new();
    let mut limit: Option<Limit> = None;
    let mut previous_t = 0;
    for (index, line) in input.lines().enumerate() {
        let number = index + 1;
        let line = line.with_context(|| format!("line {number}: cannot read"))?;
        if line.trim().is_empty() {
            continue;
        }
        let limit = match &mut limit {
            Some(limit) => &*limit,
            // The first line that is not blank: a header, or the first request.
            None if trace::is_header(&line) => {
                let header = trace::parse_header(&line).with_context(|| format!("line {number}"))?;
                limit = Some(flags.with_header(header, number)?);
                continue;
            }
            None => limit.insert(flags.require()?),
        };
        let request = trace::parse_request(&line).map_err(|error| {
            if trace::is_header(&line) {
                anyhow::anyhow!(
                    "line {number}: a params header must be the trace's first line, before any request (a trace has \
                     one limit)"
                )
            } else {
                anyhow::Error::new(error).context(format!("line {number}"))
            }
        })?;
        if request.t < previous_t {
            bail!(
                "line {number}: t {} is before the previous request's t {previous_t} (t must not decrease)",
                request.t
            );
        }
        previous_t = request.t;
        let state = states.entry(request.key).or_insert_with(|| State::idle(limit));
        let decision = state.check(request.t, limit, request.cost).with_context(|| format!("line {number}"))?;
        if let Some(tally) = tally.as_deref_mut() {
            tally.record(number, request.expect.as_ref(), &decision);
        }
        serde_json::to_writer(&mut *out, &Output::from(decision)).context("cannot write decisions")?;
        out.write_all(b"\n").context("cannot write decisions")?;
    }
    if limit.is_none() {
        // An empty trace still needs a limit: a missing or invalid one is not silently ignored.
        flags.require()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::Algorithm;

    fn run_text(limit: &str, algorithm: Algorithm, input: &str) -> (String, anyhow::Result<()>) {
        let limit = limit.parse::<tollgate_core::LimitBuilder>().unwrap().algorithm(algorithm).build().unwrap();
        let flags = Flags { limit: Some(limit), given: Some("--algorithm --limit".into()) };
        let mut out = Vec::new();
        let result = replay(&flags, input.as_bytes(), &mut out, None);
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
            ("{\"t\":6,\"key\":\"a\",\"cots\":2}", "line 2: unknown field `cots`"),
            (
                "{\"params\":{\"algorithm\":\"gcra\",\"limit\":\"1/s\"}}",
                "line 2: a params header must be the trace's first line",
            ),
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

    #[test]
    fn check_tallies_every_differing_field_by_line() {
        let limit: Limit = "1/s".parse::<tollgate_core::LimitBuilder>().unwrap().build().unwrap();
        let flags = Flags { limit: Some(limit), given: None };
        let input = "{\"params\":{\"algorithm\":\"gcra\",\"limit\":\"1/s\"}}\n\
                     {\"t\":0,\"key\":\"a\",\"expect\":{\"allowed\":true}}\n\
                     {\"t\":0,\"key\":\"a\",\"expect\":{\"allowed\":true,\"retry_after_ns\":0}}\n\
                     {\"t\":0,\"key\":\"a\",\"expect\":{}}\n";
        let mut tally = Tally::default();
        replay(&flags, input.as_bytes(), &mut Vec::new(), Some(&mut tally)).unwrap();
        assert_eq!(
            tally.mismatches,
            ["line 3: expected allowed true, got false", "line 3: expected retry_after_ns 0, got 1000000000"]
        );
        assert_eq!((tally.checked, tally.unchecked, tally.failed), (2, 1, 1));
        let verdict = tally.verdict().unwrap_err().to_string();
        assert_eq!(
            verdict,
            "1 of 2 decisions checked did not match their expect fields; 1 request without expect was not checked"
        );
    }

    #[test]
    fn the_limit_comes_from_one_place() {
        let header = "{\"params\":{\"algorithm\":\"gcra\",\"limit\":\"10/s\"}}\n{\"t\":0,\"key\":\"a\"}\n";
        let run = |flags: &Flags, input: &str| {
            let mut out = Vec::new();
            let result = replay(flags, input.as_bytes(), &mut out, None).map_err(|e| format!("{e:#}"));
            result.map(|()| String::from_utf8(out).unwrap())
        };
        assert!(run(&Flags::default(), header).unwrap().contains("\"remaining\":9"));
        let other = "1/s".parse::<tollgate_core::LimitBuilder>().unwrap().build().unwrap();
        let flags = Flags { limit: Some(other), given: Some("--algorithm gcra --limit 1/s".into()) };
        let error = run(&flags, header).unwrap_err();
        assert!(error.starts_with("line 1: the trace's params header sets gcra 10/1s burst 10, and the command line sets --algorithm gcra --limit 1/s"), "{error}");
        assert!(run(&Flags::default(), "").unwrap_err().starts_with("no limit to decide under"));
        assert!(run(&Flags::default(), "\n\n{\"t\":0,\"key\":\"a\"}\n").unwrap_err().starts_with("no limit"));
    }
}
