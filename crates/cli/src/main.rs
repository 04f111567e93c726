//! `tollgate`: the command-line front of the tollgate rate limiter.
//!
//! Subcommands live in their own modules; this file only parses arguments, dispatches, and turns
//! an error into a message on stderr and a non-zero exit status.

mod bench;
mod proxy;
mod runtime;
mod serve;
mod simulate;
mod store_args;
mod units;

use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{Parser, Subcommand};

/// tollgate: an exact rate limiter (library, server, middleware).
#[derive(Debug, Parser)]
#[command(
    name = "tollgate",
    version,
    about = "tollgate, an exact rate limiter: serve (RESP, HTTP, gRPC), proxy (rules in front of an HTTP service), simulate, bench (a load generator)",
    propagate_version = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve rate-limit decisions over RESP (redis-cell compatible) and HTTP, on memory or Redis.
    Serve(serve::ServeArgs),
    /// Apply a rules file in front of an HTTP service, as a reverse proxy.
    Proxy(proxy::ProxyArgs),
    /// Replay requests on a virtual clock, or reproduce the over-grant experiments of the articles in docs/SEMANTICS.md.
    Simulate(simulate::SimulateArgs),
    /// Put load on a rate-limit server (RESP, HTTP or Envoy's gRPC API) and report throughput, latency and decisions.
    Bench(bench::BenchArgs),
}

fn main() -> ExitCode {
    let cli = parse();
    let result = match cli.command {
        Command::Serve(args) => serve::run(args),
        Command::Proxy(args) => proxy::run(args),
        Command::Simulate(args) => simulate::run(args),
        Command::Bench(args) => bench::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // Scrubbed as clap's errors are: a file flag given a URL (`--rules redis://:PASSWORD@h`)
            // is refused naming the file.
            eprintln!("tollgate: error: {}", scrub(format!("{error:#}")));
            ExitCode::FAILURE
        }
    }
}

/// The command line, or the exit clap chooses (help, version, a usage error). A usage error may
/// quote an argument as typed (`unexpected argument 'redis://:PASSWORD@host'` when `--store` is
/// forgotten): it is [`scrub`]bed first.
fn parse() -> Cli {
    let error = match Cli::try_parse() {
        Ok(cli) => return cli,
        Err(error) => error,
    };
    if matches!(error.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        error.exit();
    }
    let rendered = error.render().to_string();
    let scrubbed = scrub(rendered.clone());
    if scrubbed == rendered {
        error.exit();
    }
    eprint!("{scrubbed}");
    std::process::exit(error.exit_code());
}

/// `text` with every argument of the command line that may hold credentials ([`secrets`])
/// replaced by what may be shown of it.
fn scrub(text: String) -> String {
    let secrets = secrets(std::env::args_os().skip(1).map(|a| a.to_string_lossy().into_owned()));
    secrets.iter().fold(text, |text, (secret, shown)| text.replace(secret.as_str(), shown))
}

/// The arguments that may hold credentials, each with what may be shown instead: store URLs
/// (any argument holding `://` or `@`, alone or after `--flag=`: its redacted form) and the
/// values of `--store-sentinel-password`.
fn secrets(args: impl Iterator<Item = String>) -> Vec<(String, String)> {
    const PASSWORD_FLAG: &str = "--store-sentinel-password";
    let mut found = Vec::new();
    let mut after_password_flag = false;
    for arg in args {
        let (flag, value) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (Some(flag), value.to_string()),
            _ => (None, arg.clone()),
        };
        if after_password_flag || flag == Some(PASSWORD_FLAG) {
            found.push((value, "<redacted>".to_string()));
        } else if value.contains("://") || value.contains('@') {
            let shown = tollgate_server::config::redacted(&value);
            found.push((value, shown));
        }
        after_password_flag = arg == PASSWORD_FLAG;
    }
    // The longest first, so that a secret holding another is replaced whole.
    found.retain(|(secret, _)| !secret.is_empty());
    found.sort_by_key(|(secret, _)| std::cmp::Reverse(secret.len()));
    found
}
