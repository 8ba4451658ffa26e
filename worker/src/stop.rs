//! Stopping a rank before its end. SIGTERM (a pod's grace period, `kubectl drain`, local mode passing on
//! Ctrl-C) or SIGINT becomes a [`StopRequest`]: the training loop reads it at every step boundary and ends
//! there; the rank then leaves its peers gracefully (its streams closed after every byte of the steps it
//! finished, so a peer still finishing the same step finishes it, and fails on the next), and exits 128 + the
//! signal, as if the signal had killed it. A watcher beside the rank's work aborts the collective in flight and
//! tells the peers only when the work has not reached a step boundary within [`STOP_GRACE`] (a collective that
//! waits on a silent peer), so no rank waits for `timeoutSeconds`.

use std::convert::Infallible;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use rdu_collective::Communicator;
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::{Handle, Signals};
use tokio::sync::watch;

use crate::error::WorkerError;

/// How long a stopped rank's work may take to reach its next step boundary before the collective in flight is
/// aborted and the peers told. Aborting at once would cost the peers the step this rank just finished: a peer
/// may still be taking in its last chunk of it (a ring forwards it through a third rank).
pub(crate) const STOP_GRACE: Duration = Duration::from_secs(5);

/// A request that the rank stop, with the signal that asked; one per rank, cloned to every part that reads it.
#[derive(Clone, Debug)]
pub struct StopRequest {
    latch: Arc<watch::Sender<Option<i32>>>,
    /// Whether [`StopRequest::listen`] turns this process's signals into requests (not in in-process tests,
    /// where several ranks share one process).
    signals: bool,
}

impl StopRequest {
    /// A request made only by [`StopRequest::request`].
    pub fn manual() -> Self {
        StopRequest {
            latch: Arc::new(watch::Sender::new(None)),
            signals: false,
        }
    }

    /// A request that this process's SIGTERM or SIGINT makes, once [`StopRequest::listen`] runs.
    pub fn on_signals() -> Self {
        StopRequest {
            signals: true,
            ..StopRequest::manual()
        }
    }

    /// Asks the rank to stop as `signal` would; the first request is kept.
    pub fn request(&self, signal: i32) {
        self.latch.send_if_modified(|current| {
            let first = current.is_none();
            current.get_or_insert(signal);
            first
        });
    }

    /// The signal that asked the rank to stop, if one did.
    pub fn requested(&self) -> Option<i32> {
        *self.latch.borrow()
    }

    /// Resolves with the signal once a stop is requested.
    pub async fn wait(&self) -> i32 {
        let mut rx = self.latch.subscribe();
        match rx.wait_for(Option::is_some).await {
            Ok(signal) => signal.unwrap_or(SIGTERM),
            // The sender lives in `self`: it cannot be gone while this waits.
            Err(_) => std::future::pending().await,
        }
    }

    /// From now on SIGTERM and SIGINT make this request instead of killing the process, until the returned
    /// listener is dropped (for [`StopRequest::manual`], nothing changes). Called first thing: the signal's default
    /// action would not end the rank where it runs as a container's first process (PID 1 of its namespace
    /// ignores signals it has no handler for).
    pub fn listen(&self) -> Option<SignalListener> {
        if !self.signals {
            return None;
        }
        match SignalListener::start(self.clone()) {
            Ok(listener) => Some(listener),
            Err(e) => {
                tracing::warn!(error = %rdu_error_chain::Chain(&e), "cannot handle SIGTERM; a signal kills this rank without a checkpoint");
                None
            }
        }
    }

    /// `error`, or [`WorkerError::Stopped`] when a stop was requested (the collective error a stop causes
    /// is the stop's consequence, not the reason the rank ends).
    pub fn explain(&self, error: WorkerError) -> WorkerError {
        match self.requested() {
            Some(signal) => WorkerError::Stopped { signal },
            None => error,
        }
    }

    /// Runs `work`; a stop requested meanwhile lets it end at its next step boundary, and aborts `comm` when it has
    /// not within [`STOP_GRACE`], so a collective in flight fails on this rank and the peers are told (retryably:
    /// a new generation can carry on).
    pub async fn abort_on_stop<T>(
        &self,
        comm: &Communicator,
        work: impl Future<Output = Result<T, WorkerError>>,
    ) -> Result<T, WorkerError> {
        let watcher = async {
            let signal = self.wait().await;
            tokio::time::sleep(STOP_GRACE).await;
            tracing::warn!(
                signal,
                "stop requested and no step boundary reached: aborting the collective in flight and telling the peers"
            );
            comm.abort(&format!("rank {} stopped by signal {signal}", comm.rank()))
                .await;
            std::future::pending::<Infallible>().await
        };
        tokio::select! {
            done = work => done.map_err(|e| self.explain(e)),
            never = watcher => match never {},
        }
    }
}

/// A thread that turns SIGTERM and SIGINT into a [`StopRequest`] (signal-hook's self-pipe: nothing runs in the
/// signal handler itself, and the request is seen even while the rank computes without yielding to its runtime).
pub struct SignalListener {
    handle: Handle,
    thread: Option<JoinHandle<()>>,
}

impl SignalListener {
    fn start(stop: StopRequest) -> std::io::Result<Self> {
        let mut signals = Signals::new([SIGTERM, SIGINT])?;
        let handle = signals.handle();
        let thread = std::thread::Builder::new()
            .name("stop-signals".into())
            .spawn(move || {
                for signal in signals.forever() {
                    stop.request(signal);
                }
            })?;
        Ok(SignalListener {
            handle,
            thread: Some(thread),
        })
    }
}

impl Drop for SignalListener {
    fn drop(&mut self) {
        self.handle.close();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_request_is_kept_and_wakes_a_waiter() {
        let stop = StopRequest::manual();
        assert_eq!(stop.requested(), None);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let waiter = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap()
                    .block_on(stop.wait())
            })
        };
        stop.request(SIGTERM);
        stop.request(SIGINT);
        assert_eq!(waiter.join().unwrap(), SIGTERM);
        assert_eq!(stop.requested(), Some(SIGTERM));
        assert_eq!(runtime.block_on(stop.wait()), SIGTERM);
    }

    #[test]
    fn a_stop_explains_the_error_it_caused() {
        let stop = StopRequest::manual();
        let aborted = || {
            WorkerError::Collective(rdu_collective::CollectiveError::Aborted { reason: "x".into() })
        };
        assert!(matches!(
            stop.explain(aborted()),
            WorkerError::Collective(_)
        ));
        stop.request(SIGTERM);
        let stopped = stop.explain(aborted());
        assert!(matches!(stopped, WorkerError::Stopped { signal: SIGTERM }));
        assert_eq!(stopped.exit_code(), 143);
    }

    #[test]
    fn a_manual_request_installs_no_signal_handler() {
        assert!(StopRequest::manual().listen().is_none());
    }
}
