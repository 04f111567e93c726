//! The run's figures: the table printed at the end, `--json` and `--timeline` CSV.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;

use super::record::Tally;

/// Everything the run measured.
#[derive(Debug)]
pub(crate) struct Summary {
    pub(crate) total: Tally,
    pub(crate) seconds: Vec<Tally>,
    pub(crate) elapsed: Duration,
    /// Whether replies are rate-limit decisions (else allowed/denied are `null`).
    pub(crate) decisions: bool,
    pub(crate) first_error: Option<String>,
    /// Allowed decisions per key number (runs over at most `MAX_KEYS_COUNTED` keys).
    pub(crate) allowed_per_key: Option<Vec<u64>>,
}

/// `--json`'s document.
#[derive(Debug, Serialize)]
struct JsonReport {
    requests: u64,
    errors: u64,
    throughput_per_s: f64,
    allowed: Option<u64>,
    denied: Option<u64>,
    latency_us: Percentiles,
    /// Allowed decisions per key (`PREFIX0` first), when replies are decisions and the run had at
    /// most 65,536 keys.
    #[serde(skip_serializing_if = "Option::is_none")]
    allowed_per_key: Option<Vec<u64>>,
}

/// Latency percentiles in microseconds; `null` when no request got a reply.
#[derive(Debug, Serialize)]
struct Percentiles {
    p50: Option<u64>,
    p90: Option<u64>,
    p99: Option<u64>,
    p999: Option<u64>,
    max: Option<u64>,
}

fn percentiles(tally: &Tally) -> Percentiles {
    let h = &tally.latency_us;
    let at = |q: f64| (!h.is_empty()).then(|| h.value_at_quantile(q));
    Percentiles { p50: at(0.5), p90: at(0.9), p99: at(0.99), p999: at(0.999), max: (!h.is_empty()).then(|| h.max()) }
}

impl Summary {
    pub(crate) fn throughput(&self) -> f64 {
        let seconds = self.elapsed.as_secs_f64();
        if seconds > 0.0 { self.total.requests as f64 / seconds } else { 0.0 }
    }

    fn decision_counts(&self, tally: &Tally) -> (Option<u64>, Option<u64>) {
        if self.decisions { (Some(tally.allowed), Some(tally.denied)) } else { (None, None) }
    }

    /// The table printed at the end of a run.
    pub(crate) fn table(&self) -> String {
        let t = &self.total;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:>12} {:>10} {:>14} {:>10} {:>12} {:>12}",
            "requests", "errors", "throughput/s", "seconds", "allowed", "denied"
        );
        let (allowed, denied) = self.decision_counts(t);
        let share = |n: Option<u64>| {
            n.map_or_else(|| "-".to_string(), |n| format!("{n} ({:.1}%)", 100.0 * n as f64 / t.requests.max(1) as f64))
        };
        let _ = writeln!(
            out,
            "{:>12} {:>10} {:>14.0} {:>10.2} {:>12} {:>12}",
            t.requests,
            t.errors(),
            self.throughput(),
            self.elapsed.as_secs_f64(),
            share(allowed),
            share(denied)
        );
        if t.errors() > 0 {
            let _ = writeln!(
                out,
                "errors: {} error replies, {} transport, {} timeouts; first: {}",
                t.error_replies,
                t.transport_errors,
                t.timeouts,
                self.first_error.as_deref().unwrap_or("-")
            );
        }
        let p = percentiles(t);
        let ms = |us: Option<u64>| us.map_or_else(|| "-".to_string(), |us| format!("{:.3}", us as f64 / 1000.0));
        let _ = writeln!(
            out,
            "\n{:>12} {:>10} {:>10} {:>10} {:>10} {:>10}",
            "latency ms", "p50", "p90", "p99", "p99.9", "max"
        );
        let _ = writeln!(
            out,
            "{:>12} {:>10} {:>10} {:>10} {:>10} {:>10}",
            "",
            ms(p.p50),
            ms(p.p90),
            ms(p.p99),
            ms(p.p999),
            ms(p.max)
        );
        out
    }

    pub(crate) fn json(&self) -> String {
        let (allowed, denied) = self.decision_counts(&self.total);
        let report = JsonReport {
            requests: self.total.requests,
            errors: self.total.errors(),
            throughput_per_s: (self.throughput() * 10.0).round() / 10.0,
            allowed,
            denied,
            latency_us: percentiles(&self.total),
            allowed_per_key: self.allowed_per_key.clone().filter(|_| self.decisions),
        };
        // Plain numbers and options: serialization cannot fail.
        serde_json::to_string_pretty(&report).unwrap_or_default()
    }

    /// One row per elapsed second: what completed in that second.
    pub(crate) fn timeline_csv(&self) -> String {
        let mut out = String::from("second,requests,errors,allowed,denied,p50_us,p90_us,p99_us,p999_us,max_us\n");
        let field = |v: Option<u64>| v.map_or_else(String::new, |v| v.to_string());
        for (i, second) in self.seconds.iter().enumerate() {
            let (allowed, denied) = self.decision_counts(second);
            let p = percentiles(second);
            let _ = writeln!(
                out,
                "{},{},{},{},{},{},{},{},{},{}",
                i + 1,
                second.requests,
                second.errors(),
                field(allowed),
                field(denied),
                field(p.p50),
                field(p.p90),
                field(p.p99),
                field(p.p999),
                field(p.max)
            );
        }
        out
    }
}

pub(crate) fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Instant;

    use super::super::record::{Answer, Failure, Recorder, Shared};
    use super::*;

    fn summary(decisions: bool) -> Summary {
        let start = Instant::now();
        let shared = Arc::new(Shared::new(start, 1));
        let mut recorder = Recorder::new(shared.clone());
        let ms = Duration::from_millis;
        for i in 0..100u64 {
            let answer = if i < 10 { Ok(Answer::Allowed) } else { Ok(Answer::Denied) };
            recorder.record(start, start + ms(i + 1), answer);
        }
        recorder.record(start + ms(1000), start + ms(2100), Err(Failure::Timeout));
        let total = recorder.finish();
        Summary {
            total,
            seconds: shared.seconds(ms(2500)),
            elapsed: ms(2500),
            decisions,
            first_error: shared.first_error(),
            allowed_per_key: shared.allowed_per_key(),
        }
    }

    #[test]
    fn json_has_exactly_the_documented_fields() {
        let json: serde_json::Value = serde_json::from_str(&summary(true).json()).unwrap();
        // (serde_json's map is sorted: this is the set of fields.)
        let keys: Vec<_> = json.as_object().unwrap().keys().cloned().collect();
        assert_eq!(
            keys,
            ["allowed", "allowed_per_key", "denied", "errors", "latency_us", "requests", "throughput_per_s"]
        );
        assert_eq!(json["allowed_per_key"], serde_json::json!([0]), "one key: the summary's Shared counted none");
        assert_eq!(json["requests"], 101);
        assert_eq!(json["errors"], 1);
        assert_eq!(json["throughput_per_s"], 40.4);
        assert_eq!((json["allowed"].as_u64(), json["denied"].as_u64()), (Some(10), Some(90)));
        let latency = json["latency_us"].as_object().unwrap();
        assert_eq!(latency.keys().collect::<Vec<_>>(), ["max", "p50", "p90", "p99", "p999"]);
        // 1..=100 ms (the timeout has no latency): p50 is 50 ms within the histogram's 0.1%.
        let p50 = json["latency_us"]["p50"].as_u64().unwrap();
        assert!((49_950..=50_050).contains(&p50), "{p50}");
        assert_eq!(json["latency_us"]["max"].as_u64().map(|m| m / 1000), Some(100));

        let plain: serde_json::Value = serde_json::from_str(&summary(false).json()).unwrap();
        assert!(plain["allowed"].is_null() && plain["denied"].is_null());
    }

    #[test]
    fn the_timeline_has_a_row_per_second_empty_ones_included() {
        let csv = summary(true).timeline_csv();
        let lines: Vec<_> = csv.lines().collect();
        assert_eq!(lines[0], "second,requests,errors,allowed,denied,p50_us,p90_us,p99_us,p999_us,max_us");
        assert_eq!(lines.len(), 4);
        assert!(lines[1].starts_with("1,100,0,10,90,"), "{}", lines[1]);
        assert_eq!(lines[2], "2,0,0,0,0,,,,,");
        assert_eq!(lines[3], "3,1,1,0,0,,,,,");
        let table = summary(true).table();
        assert!(table.contains("10 (9.9%)") && table.contains("first: no reply within --timeout"), "{table}");
    }
}
