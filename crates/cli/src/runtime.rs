//! The runtime `tollgate serve` runs on (`--runtime`, `--workers`).
//!
//! - **shared** (the default): one work-stealing runtime with `--workers` threads, every task on
//!   any of them.
//! - **per-core**: one single-threaded runtime per worker thread. The first, on
//!   the main thread, runs the server (listeners, gRPC, signals, reloads, health probes) and
//!   serves connections too; each RESP and HTTP connection is handed, in turn, to one of the
//!   runtimes and lives there (see `tollgate_server::workers`), so a decision that waits on
//!   Redis is woken on its own thread, with no other thread to wake. Tasks a connection starts
//!   (a lease's call, a Redis connection made by its first call) run on its runtime. Not the
//!   default: it serves more Redis decisions a second for less CPU each, but a denied hot key
//!   (leases) fewer (see docs/serve.md, Runtime).

use std::future::Future;

use anyhow::Context;
use clap::ValueEnum;
use tokio::sync::watch;
use tollgate_server::Workers;

/// How `serve` runs its tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Model {
    /// One single-threaded runtime per worker thread, connections handed to each in turn.
    PerCore,
    /// One work-stealing runtime shared by every worker thread.
    Shared,
}

/// How many worker threads by default: the cores this process may run on (its CPU affinity,
/// e.g. under `taskset`, and its cgroup's quota, as Rust reads them).
pub(crate) fn default_workers() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get).min(crate::units::MAX_WORKERS)
}

/// Runs `main`, given the workers its connections are to be handed to, on `workers` threads as
/// `model` says, and returns its outcome once every worker thread has stopped.
pub(crate) fn run<T, F, Fut>(model: Model, workers: usize, main: F) -> anyhow::Result<T>
where
    F: FnOnce(Workers) -> Fut,
    Fut: Future<Output = anyhow::Result<T>>,
{
    let workers = workers.max(1);
    if model == Model::Shared {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build()
            .context("cannot start the runtime")?;
        return runtime.block_on(main(Workers::default()));
    }
    let runtime = single_threaded()?;
    if workers == 1 {
        // Everything on this thread: nothing to hand over.
        return runtime.block_on(main(Workers::default()));
    }
    let (stop, stopped) = watch::channel(false);
    let mut handles = vec![runtime.handle().clone()];
    let mut threads = Vec::with_capacity(workers - 1);
    for index in 1..workers {
        let worker = single_threaded()?;
        handles.push(worker.handle().clone());
        let mut stopped = stopped.clone();
        let thread = std::thread::Builder::new()
            .name(format!("tollgate-worker-{index}"))
            .spawn(move || {
                worker.block_on(async move {
                    let _ = stopped.wait_for(|&stop| stop).await;
                });
                // Dropped here, on its own thread: the tasks still on it end with it.
            })
            .context("cannot start a worker thread")?;
        threads.push(thread);
    }
    let outcome = runtime.block_on(main(Workers::new(handles)));
    // The server has returned (its connections finished or closed): the workers stop.
    let _ = stop.send(true);
    for thread in threads {
        if thread.join().is_err() {
            tracing::error!("a worker thread panicked");
        }
    }
    outcome
}

fn single_threaded() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().context("cannot start the runtime")
}
