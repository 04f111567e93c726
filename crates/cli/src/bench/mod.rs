//! `tollgate bench`: a load generator for rate-limit servers, tollgate's or any other.
//!
//! Three targets — RESP (any command, so redis-cell and plain Redis too), HTTP and Envoy's
//! rate-limit gRPC API — share one driver: `-c` connections, `-P` requests in flight on each,
//! keys drawn uniformly or Zipf over `--keys N`, a closed loop or an open loop at `--rate R`
//! whose latencies are measured from each request's intended send time (see [`schedule`]).
//! The report counts requests, errors and, when replies are rate-limit decisions, allowed and
//! denied; latencies come from HDR histograms. `--json`, `--timeline` and `--plot` write the
//! same figures for scripts (`scripts/failure-injection.sh`) and people.

mod call;
mod keys;
mod plot;
mod record;
mod report;
mod resp;
mod schedule;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use self::call::{Caller, GrpcTarget, HttpTarget};
use self::keys::Keys;
use self::record::{MAX_LATENCY, Shared, Tally};
use self::report::Summary;
use self::schedule::{Schedule, Stop};
use crate::units;

/// The most connections and the deepest pipeline accepted.
const MAX_CONNECTIONS: usize = 100_000;
const MAX_PIPELINE: usize = 10_000;
/// The highest open-loop rate accepted, requests per second.
const MAX_RATE: f64 = 100e6;
/// The longest `--duration`: the timeline keeps a small histogram (20 KiB) per second.
const MAX_DURATION: Duration = Duration::from_secs(3600);
/// Requests of a run given neither `-n` nor `--duration`.
const DEFAULT_REQUESTS: u64 = 100_000;

#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    #[command(subcommand)]
    target: Target,
}

#[derive(Debug, Subcommand)]
enum Target {
    /// A RESP server: tollgate (CL.THROTTLE, TG.CHECK, TG.LIMIT), redis-cell, throttlecrab-server or plain Redis.
    Resp {
        /// The server, HOST:PORT.
        #[arg(long, value_parser = units::address)]
        addr: String,
        /// The command sent, `{key}` replaced by each request's key (e.g. "CL.THROTTLE {key} 15 30 60 1").
        #[arg(long)]
        command: String,
        #[command(flatten)]
        load: LoadArgs,
    },
    /// An HTTP endpoint: tollgate's POST /v1/check, `tollgate proxy`, or any URL.
    Http {
        /// http://HOST:PORT/PATH, `{key}` allowed in the path and query.
        #[arg(long)]
        url: String,
        /// The request method.
        #[arg(long, default_value = "GET")]
        method: String,
        /// The request body (JSON by default), `{key}` replaced (e.g. '{"key":"{key}","limit":"100/s"}').
        #[arg(long)]
        body: Option<String>,
        /// A request header, 'Name: value' (repeatable).
        #[arg(long = "header", value_name = "HEADER")]
        headers: Vec<String>,
        #[command(flatten)]
        load: LoadArgs,
    },
    /// Envoy's rate-limit service (envoy.service.ratelimit.v3): tollgate, envoyproxy/ratelimit, limitador.
    Grpc {
        /// The server, HOST:PORT.
        #[arg(long, value_parser = units::address)]
        addr: String,
        /// The rate-limit domain.
        #[arg(long)]
        domain: String,
        /// A descriptor, key=value[,key=value] (repeatable), `{key}` replaced in values.
        #[arg(long = "descriptor", value_name = "DESCRIPTOR", required = true)]
        descriptors: Vec<String>,
        #[command(flatten)]
        load: LoadArgs,
    },
}

/// How much load, and where the figures go.
#[derive(Debug, Args)]
struct LoadArgs {
    /// Connections.
    #[arg(short = 'c', long, default_value = "50", value_parser = units::positive)]
    connections: usize,
    /// Requests in flight on each connection (RESP: pipelined; gRPC: concurrent streams; HTTP: 1).
    #[arg(short = 'P', long, default_value = "1", value_parser = units::positive)]
    pipeline: usize,
    /// Requests to send (default 100000, unless --duration is given).
    #[arg(short = 'n', long, value_parser = units::positive, conflicts_with = "duration")]
    requests: Option<usize>,
    /// How long to send (e.g. 10s).
    #[arg(long, value_parser = units::duration)]
    duration: Option<Duration>,
    /// Open loop: requests per second in total, each measured from its intended send time.
    #[arg(long, allow_hyphen_values = true)]
    rate: Option<f64>,
    /// Keys {key} is drawn from.
    #[arg(long, default_value = "1", value_parser = units::positive)]
    keys: usize,
    /// Draw keys Zipf(S) (key 0 the hottest) instead of uniformly.
    #[arg(long, value_name = "S", allow_hyphen_values = true)]
    zipf: Option<f64>,
    /// Keys are named PREFIX0 … PREFIX{N-1}.
    #[arg(long, default_value = "key:")]
    key_prefix: String,
    /// A request with no reply after this long is an error.
    #[arg(long, default_value = "2s", value_parser = units::duration)]
    timeout: Duration,
    /// Worker threads (default: the machine's cores).
    #[arg(long, value_parser = units::positive)]
    threads: Option<usize>,
    /// Write the figures as JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write one CSV row per second.
    #[arg(long, value_name = "FILE.csv")]
    timeline: Option<PathBuf>,
    /// Draw throughput, latency and decisions over time (SVG).
    #[arg(long, value_name = "FILE.svg", value_parser = units::svg_path)]
    plot: Option<PathBuf>,
    /// No progress bar, and no title line on stderr.
    #[arg(short, long)]
    quiet: bool,
}

impl LoadArgs {
    fn check(&self) -> Result<(), String> {
        if self.connections > MAX_CONNECTIONS {
            return Err(format!("-c is at most {MAX_CONNECTIONS}, got {}", self.connections));
        }
        if self.pipeline > MAX_PIPELINE {
            return Err(format!("-P is at most {MAX_PIPELINE}, got {}", self.pipeline));
        }
        if let Some(rate) = self.rate
            && !(rate.is_finite() && rate > 0.0 && rate <= MAX_RATE)
        {
            return Err(format!("--rate must be above 0 and at most {MAX_RATE:e} requests per second, got {rate}"));
        }
        if self.duration.is_some_and(|d| d > MAX_DURATION) {
            return Err("--duration is at most 1h (the timeline keeps a histogram per second): run several".into());
        }
        if self.timeout > MAX_LATENCY {
            return Err(format!("--timeout is at most {}s", MAX_LATENCY.as_secs()));
        }
        Ok(())
    }

    fn stop(&self) -> Stop {
        match (self.duration, self.requests) {
            (Some(duration), _) => Stop::After(duration),
            (None, Some(n)) => Stop::Requests(n as u64),
            (None, None) => Stop::Requests(DEFAULT_REQUESTS),
        }
    }
}

/// Runs `tollgate bench`.
pub(crate) fn run(args: BenchArgs) -> anyhow::Result<()> {
    let load = match &args.target {
        Target::Resp { load, .. } | Target::Http { load, .. } | Target::Grpc { load, .. } => load,
    };
    load.check().map_err(anyhow::Error::msg)?;
    let keys = Arc::new(Keys::new(&load.key_prefix, load.keys as u64, load.zipf).map_err(anyhow::Error::msg)?);
    let threads = load.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(2, usize::from));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    let (title, summary) = runtime.block_on(drive(&args.target, load, keys))?;
    print!("{}", summary.table());
    if let Some(path) = &load.json {
        report::write(path, &(summary.json() + "\n"))?;
    }
    if let Some(path) = &load.timeline {
        report::write(path, &summary.timeline_csv())?;
    }
    if let Some(path) = &load.plot {
        plot::draw(path, &title, &summary)?;
    }
    Ok(())
}

/// Starts every connection, shows progress, and gathers the figures.
async fn drive(target: &Target, load: &LoadArgs, keys: Arc<Keys>) -> anyhow::Result<(String, Summary)> {
    // Every argument is checked before anything connects.
    let addr = match target {
        Target::Resp { addr, command, .. } => {
            resp::Command::parse(command).map_err(anyhow::Error::msg)?;
            addr.clone()
        }
        Target::Http { url, method, body, headers, .. } => {
            HttpTarget::new(url, method, body.as_deref(), headers).map_err(anyhow::Error::msg)?.addr().to_string()
        }
        Target::Grpc { addr, domain, descriptors, .. } => {
            GrpcTarget::new(addr, domain, descriptors).map_err(anyhow::Error::msg)?;
            addr.clone()
        }
    };
    if let Target::Http { .. } = target
        && load.pipeline > 1
    {
        anyhow::bail!("-P must be 1 for HTTP (HTTP/1.1 has no usable pipelining): use more connections (-c)");
    }
    preflight(&addr, load.timeout).await?;
    let start = Instant::now();
    let schedule = Arc::new(Schedule::new(start, load.stop(), load.rate));
    let shared = Arc::new(Shared::new(start, load.keys));
    let (title, decisions, tasks) = spawn(target, load, keys.clone(), &schedule, &shared)?;
    let mode = load.rate.map_or_else(|| "closed loop".to_string(), |r| format!("open loop at {r}/s"));
    let title =
        format!("{title} — {mode}, {} connections, pipeline {}, {} keys", load.connections, load.pipeline, load.keys);
    if !load.quiet {
        eprintln!("tollgate bench: {title}");
    }
    let (bar, progress) = progress(load, &schedule, &shared);
    let mut total = Tally::total();
    for task in tasks {
        total.merge(&task.await.context("a connection task failed")?);
    }
    let elapsed = start.elapsed();
    progress.abort();
    bar.finish_and_clear();
    let summary = Summary {
        total,
        seconds: shared.seconds(elapsed),
        elapsed,
        decisions: decisions.unwrap_or_else(|| shared_decisions(&shared, elapsed)),
        first_error: shared.first_error(),
        allowed_per_key: shared.allowed_per_key(),
    };
    Ok((title, summary))
}

/// One connection before the run: a wrong address or a server not started is an error at once,
/// not a run of refused requests (a server that fails during the run is counted, request by
/// request).
async fn preflight(addr: &str, timeout: Duration) -> anyhow::Result<()> {
    match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(error)) => anyhow::bail!("cannot connect to {addr}: {error} (is the server running there?)"),
        Err(_) => anyhow::bail!("cannot connect to {addr}: no answer within --timeout"),
    }
}

/// Whether an HTTP run's replies were decisions: any allowed or denied seen.
fn shared_decisions(shared: &Shared, elapsed: Duration) -> bool {
    shared.seconds(elapsed).iter().any(|s| s.allowed + s.denied > 0)
}

type Tasks = Vec<tokio::task::JoinHandle<Tally>>;

/// Spawns the target's connections: a title, whether replies are decisions (`None`: judge by
/// the replies), and the tasks.
fn spawn(
    target: &Target,
    load: &LoadArgs,
    keys: Arc<Keys>,
    schedule: &Arc<Schedule>,
    shared: &Arc<Shared>,
) -> anyhow::Result<(String, Option<bool>, Tasks)> {
    let single_key_warning = |has_key: bool| {
        if !has_key && load.keys > 1 {
            eprintln!("tollgate bench: warning: --keys {} has no effect: the request has no {{key}}", load.keys);
        }
    };
    let mut tasks = Vec::new();
    match target {
        Target::Resp { addr, command, .. } => {
            let command = resp::Command::parse(command).map_err(anyhow::Error::msg)?;
            single_key_warning(command.has_key());
            let decisions = command.kind != resp::ReplyKind::Plain;
            let title = format!("resp {addr} {:?}", command_text(target));
            let target = Arc::new(resp::Target {
                addr: addr.clone(),
                command,
                keys,
                pipeline: load.pipeline,
                timeout: load.timeout,
            });
            for id in 0..load.connections as u64 {
                tasks.push(tokio::spawn(resp::connection(id, target.clone(), schedule.clone(), shared.clone())));
            }
            Ok((title, Some(decisions), tasks))
        }
        Target::Http { url, method, body, headers, .. } => {
            let http = Arc::new(HttpTarget::new(url, method, body.as_deref(), headers).map_err(anyhow::Error::msg)?);
            single_key_warning(http.has_key());
            for id in 0..load.connections as u64 {
                let caller = Caller::Http { target: http.clone(), sender: None };
                tasks.push(tokio::spawn(call::worker(
                    id,
                    caller,
                    keys.clone(),
                    load.timeout,
                    schedule.clone(),
                    shared.clone(),
                )));
            }
            Ok((format!("http {method} {url}"), None, tasks))
        }
        Target::Grpc { addr, domain, descriptors, .. } => {
            let grpc = Arc::new(GrpcTarget::new(addr, domain, descriptors).map_err(anyhow::Error::msg)?);
            single_key_warning(grpc.has_key());
            for connection in 0..load.connections as u64 {
                let channel = Caller::grpc_channel(&grpc, load.timeout).map_err(anyhow::Error::msg)?;
                for slot in 0..load.pipeline as u64 {
                    let client = tollgate_rls::RateLimitServiceClient::new(channel.clone());
                    let caller = Caller::Grpc { target: grpc.clone(), client };
                    let id = connection * load.pipeline as u64 + slot;
                    tasks.push(tokio::spawn(call::worker(
                        id,
                        caller,
                        keys.clone(),
                        load.timeout,
                        schedule.clone(),
                        shared.clone(),
                    )));
                }
            }
            Ok((format!("grpc {addr} domain {domain} {}", descriptors.join(" ")), Some(true), tasks))
        }
    }
}

fn command_text(target: &Target) -> &str {
    match target {
        Target::Resp { command, .. } => command,
        _ => "",
    }
}

/// A live progress bar on stderr (hidden when stderr is not a terminal or with `--quiet`),
/// updated five times a second with requests done, errors and the last interval's throughput.
fn progress(
    load: &LoadArgs,
    schedule: &Arc<Schedule>,
    shared: &Arc<Shared>,
) -> (ProgressBar, tokio::task::JoinHandle<()>) {
    let target = if load.quiet { ProgressDrawTarget::hidden() } else { ProgressDrawTarget::stderr() };
    let (bar, by_time) = match (schedule.planned_length(), load.requests) {
        (Some(length), _) => (ProgressBar::with_draw_target(Some(millis(length)), target), true),
        (None, n) => (ProgressBar::with_draw_target(Some(n.map_or(DEFAULT_REQUESTS, |n| n as u64)), target), false),
    };
    let template = if by_time { "{bar:30} {elapsed}/{duration} {msg}" } else { "{bar:30} {pos}/{len} {msg}" };
    // The template is a constant known to parse.
    bar.set_style(ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()));
    let (schedule, shared, shown) = (schedule.clone(), shared.clone(), bar.clone());
    let task = tokio::spawn(async move {
        let mut last = (Instant::now(), 0u64);
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        loop {
            tick.tick().await;
            let now = Instant::now();
            let done = shared.done.load(Ordering::Relaxed);
            let rate = (done - last.1) as f64 / now.duration_since(last.0).as_secs_f64().max(1e-3);
            last = (now, done);
            let position = if by_time { millis(now.duration_since(schedule.start())) } else { done };
            shown.set_position(position);
            shown.set_message(format!("{done} done, {} errors, {rate:.0}/s", shared.errors.load(Ordering::Relaxed)));
        }
    });
    (bar, task)
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
