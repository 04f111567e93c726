//! `tollgate`: the command-line front of the tollgate rate limiter.
//!
//! Subcommands live in their own modules; this file only parses arguments, dispatches, and turns
//! an error into a message on stderr and a non-zero exit status.

mod bench;
mod proxy;
mod serve;
mod simulate;
mod store_args;
mod units;

use std::process::ExitCode;

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
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => serve::run(args),
        Command::Proxy(args) => proxy::run(args),
        Command::Simulate(args) => simulate::run(args),
        Command::Bench(args) => bench::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tollgate: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
