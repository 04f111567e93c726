//! Where the RESP and HTTP connections run: on the runtime that accepted them (the default, one
//! work-stealing runtime for everything), or handed in turn to each of a set of runtimes
//! (`tollgate serve --runtime per-core`: one single-threaded runtime per worker thread).
//!
//! Why hand connections to single-threaded runtimes: a decision that waits on Redis suspends its
//! connection's task, and the task that reads Redis's replies wakes it. On a work-stealing
//! runtime that wake-up often lands on another worker, parked in the kernel, which must be woken
//! (a futex, a context switch) and then steals the task; a memory decision never pays it, since it
//! completes in the poll that read the command. On a single-threaded runtime a task woken by a
//! task of the same runtime is queued where it is and run in the same pass: no thread woken.
//!
//! A connection handed to a worker is registered with that worker's reactor (its socket taken out
//! of the accepting runtime's and put into the worker's), so that its reads and writes are
//! polled, and its task woken, on the worker's own thread.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::net::TcpStream;
use tokio::runtime::Handle;
use tokio::task::JoinSet;

/// The runtimes connections are handed to, in turn; none: the accepting runtime's own tasks.
#[derive(Clone, Default)]
pub struct Workers {
    handles: Arc<[Handle]>,
    next: Arc<AtomicUsize>,
}

impl fmt::Debug for Workers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Workers").field("runtimes", &self.handles.len()).finish()
    }
}

impl Workers {
    /// Connections handed to `handles` in turn (none: served where they are accepted).
    #[must_use]
    pub fn new(handles: Vec<Handle>) -> Self {
        Workers { handles: handles.into(), next: Arc::default() }
    }

    /// How many runtimes connections are handed to (0: the accepting one's).
    #[must_use]
    pub fn len(&self) -> usize {
        self.handles.len()
    }

    /// Whether connections are served where they are accepted.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.handles.is_empty()
    }

    /// The runtime the next connection goes to.
    fn next(&self) -> Option<&Handle> {
        if self.handles.is_empty() {
            return None;
        }
        let turn = self.next.fetch_add(1, Ordering::Relaxed);
        Some(&self.handles[turn % self.handles.len()])
    }

    /// Serves `stream` with `serve` as a task of `tasks`: on the next worker (the stream moved to
    /// its reactor), or on the current runtime when there are none. A stream that cannot be moved
    /// (it was closed meanwhile) is dropped, and `serve` with it.
    pub(crate) fn spawn<F, Fut>(&self, tasks: &mut JoinSet<()>, stream: TcpStream, serve: F)
    where
        F: FnOnce(TcpStream) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let Some(worker) = self.next() else {
            tasks.spawn(serve(stream));
            return;
        };
        let stream = match stream.into_std() {
            Ok(stream) => stream,
            Err(error) => {
                tracing::debug!(%error, "an accepted connection could not be handed to a worker");
                return;
            }
        };
        tasks.spawn_on(
            async move {
                // Registered here, with the worker's reactor: its readiness wakes this worker.
                match TcpStream::from_std(stream) {
                    Ok(stream) => serve(stream).await,
                    Err(error) => tracing::debug!(%error, "a connection could not be registered on its worker"),
                }
            },
            worker,
        );
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// Two single-threaded runtimes on threads of their own, stopped when the sender drops.
    fn two_workers() -> (Workers, Vec<std::thread::JoinHandle<()>>, tokio::sync::watch::Sender<()>) {
        let (stop, stopped) = tokio::sync::watch::channel(());
        let mut handles = Vec::new();
        let mut threads = Vec::new();
        for index in 0..2 {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            handles.push(runtime.handle().clone());
            let mut stopped = stopped.clone();
            let thread = std::thread::Builder::new().name(format!("worker-{index}")).spawn(move || {
                runtime.block_on(async move { while stopped.changed().await.is_ok() {} });
            });
            threads.push(thread.unwrap());
        }
        (Workers::new(handles), threads, stop)
    }

    /// Connections accepted on one runtime are served on each worker in turn, on the worker's
    /// own thread, their sockets read and written there.
    #[tokio::test]
    async fn connections_are_handed_to_each_worker_in_turn_and_served_there() {
        let (workers, threads, stop) = two_workers();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let mut tasks = JoinSet::new();
        let mut clients = Vec::new();
        for _ in 0..4 {
            let client = tokio::net::TcpStream::connect(address).await.unwrap();
            let (stream, _) = listener.accept().await.unwrap();
            workers.spawn(&mut tasks, stream, |mut stream| async move {
                let mut byte = [0u8; 1];
                stream.read_exact(&mut byte).await.unwrap();
                let name = std::thread::current().name().unwrap_or("?").to_string();
                stream.write_all(format!("{}:{}\n", byte[0] as char, name).as_bytes()).await.unwrap();
            });
            clients.push(client);
        }
        let mut served = Vec::new();
        for (index, client) in clients.iter_mut().enumerate() {
            client.write_all(&[b'a' + u8::try_from(index).unwrap()]).await.unwrap();
            let mut line = String::new();
            client.read_to_string(&mut line).await.unwrap();
            served.push(line);
        }
        while tasks.join_next().await.is_some() {}
        assert_eq!(served, ["a:worker-0\n", "b:worker-1\n", "c:worker-0\n", "d:worker-1\n"]);
        drop(stop);
        for thread in threads {
            thread.join().unwrap();
        }
    }

    /// With no workers, a connection is served on the current runtime, as before.
    #[tokio::test]
    async fn without_workers_a_connection_is_served_where_it_was_accepted() {
        let workers = Workers::default();
        assert!(workers.is_empty());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = tokio::net::TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        let mut tasks = JoinSet::new();
        let here = std::thread::current().id();
        workers.spawn(&mut tasks, stream, move |mut stream| async move {
            assert_eq!(std::thread::current().id(), here);
            stream.write_all(b"ok").await.unwrap();
        });
        let mut reply = String::new();
        client.read_to_string(&mut reply).await.unwrap();
        assert_eq!(reply, "ok");
        tasks.join_next().await.unwrap().unwrap();
    }
}
