//! What the soak watches beside the injector, on its own thread (the injector blocks on kubectl, podman and
//! waits): after each fault, how long until every job it hit trains past the step it had reached (or ended),
//! and the operator's peak resident memory (`VmHWM` of every `rdu-operator` process on the nodes).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::kind::Engine;
use kube::Api;
use kube::api::ListParams;
use rdu_crds::RduJob;

/// How often the jobs are looked at.
const TICK: Duration = Duration::from_secs(1);
/// How often the operator's memory is read (every so many ticks).
const RSS_EVERY: u32 = 5;

/// A fault whose jobs have not all recovered yet.
struct Pending {
    at: Instant,
    /// Each job the fault hit and the step it had reached then.
    marks: BTreeMap<String, u64>,
}

#[derive(Default)]
struct State {
    pending: Vec<Pending>,
    recovery_seconds: Vec<f64>,
    peak_rss_kib: u64,
}

/// What the monitor saw.
pub(crate) struct Report {
    /// Seconds from each fault to every job it hit training past where it was.
    pub(crate) recovery_seconds: Vec<f64>,
    /// Faults after which some job never got back (there should be none once every job ended).
    pub(crate) unresolved: usize,
    /// The largest `VmHWM` of an operator process seen.
    pub(crate) operator_peak_rss_kib: u64,
}

pub(crate) struct Monitor {
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Monitor {
    /// Starts watching the jobs through `kubeconfig` and the operator's processes on `nodes`.
    pub(crate) fn start(kubeconfig: PathBuf, nodes: Vec<String>) -> Monitor {
        let state = Arc::new(Mutex::new(State::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (state, stop) = (state.clone(), stop.clone());
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("the monitor's runtime");
                runtime.block_on(watch(kubeconfig, nodes, state, stop));
            })
        };
        Monitor {
            state,
            stop,
            thread: Some(thread),
        }
    }

    /// A fault begins now; `marks` are the jobs running and the step each reached.
    pub(crate) fn fault(&self, marks: BTreeMap<String, u64>) {
        self.state
            .lock()
            .expect("monitor state")
            .pending
            .push(Pending {
                at: Instant::now(),
                marks,
            });
    }

    /// Stops watching; what was seen.
    pub(crate) fn finish(mut self) -> Report {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.join().expect("the monitor thread");
        }
        let state = self.state.lock().expect("monitor state");
        Report {
            recovery_seconds: state.recovery_seconds.clone(),
            unresolved: state.pending.len(),
            operator_peak_rss_kib: state.peak_rss_kib,
        }
    }
}

async fn watch(
    kubeconfig: PathBuf,
    nodes: Vec<String>,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
) {
    let client = crate::kubeconfig::client(&kubeconfig)
        .await
        .expect("the monitor's client");
    let jobs = Api::<RduJob>::namespaced(client, "default");
    let mut ticks = 0u32;
    while !stop.load(Ordering::Relaxed) {
        // While the API server is away there is nothing to learn; the pending faults wait.
        if let Ok(list) = jobs.list(&ListParams::default()).await {
            let now: BTreeMap<String, (bool, u64)> = list
                .items
                .iter()
                .map(|j| {
                    let status = j.status.as_ref();
                    let ended = status.is_some_and(|s| {
                        matches!(
                            s.phase,
                            Some(rdu_crds::JobPhase::Succeeded | rdu_crds::JobPhase::Failed)
                        )
                    });
                    let step = status
                        .and_then(|s| s.progress.as_ref())
                        .map_or(0, |p| p.step);
                    (kube::ResourceExt::name_any(j), (ended, step))
                })
                .collect();
            resolve(&mut state.lock().expect("monitor state"), &now);
        }
        if ticks.is_multiple_of(RSS_EVERY) {
            let peak = operator_hwm_kib(&nodes);
            let mut state = state.lock().expect("monitor state");
            state.peak_rss_kib = state.peak_rss_kib.max(peak);
        }
        ticks += 1;
        tokio::time::sleep(TICK).await;
    }
}

/// Resolves every pending fault whose jobs all ended, went away or trained past their marks.
fn resolve(state: &mut State, now: &BTreeMap<String, (bool, u64)>) {
    let mut still = Vec::new();
    for pending in std::mem::take(&mut state.pending) {
        let back = pending.marks.iter().all(|(job, mark)| {
            now.get(job)
                .is_none_or(|(ended, step)| *ended || step > mark)
        });
        if back {
            state
                .recovery_seconds
                .push(pending.at.elapsed().as_secs_f64());
        } else {
            still.push(pending);
        }
    }
    state.pending = still;
}

/// The largest `VmHWM` (KiB) of the `rdu-operator` processes on `nodes` now; nodes that do not answer (crashed,
/// cut off) count 0.
fn operator_hwm_kib(nodes: &[String]) -> u64 {
    let script = "for p in $(pgrep -x rdu-operator); do grep VmHWM /proc/$p/status; done; true";
    nodes
        .iter()
        .filter_map(|node| {
            std::process::Command::new(Engine::detect().program())
                .args(["exec", node, "sh", "-c", script])
                .output()
                .ok()
        })
        .flat_map(|out| {
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fault_resolves_when_every_job_it_hit_is_past_its_mark_or_ended() {
        let mut state = State::default();
        state.pending.push(Pending {
            at: Instant::now(),
            marks: BTreeMap::from([("a".into(), 100), ("b".into(), 50)]),
        });
        let mut now = BTreeMap::from([
            ("a".to_string(), (false, 101)),
            ("b".to_string(), (false, 40)),
        ]);
        resolve(&mut state, &now);
        assert_eq!((state.pending.len(), state.recovery_seconds.len()), (1, 0));
        now.insert("b".into(), (true, 40));
        resolve(&mut state, &now);
        assert_eq!((state.pending.len(), state.recovery_seconds.len()), (0, 1));
        // A job that went away (checked and deleted) does not hold a fault open.
        state.pending.push(Pending {
            at: Instant::now(),
            marks: BTreeMap::from([("gone".into(), 7)]),
        });
        resolve(&mut state, &BTreeMap::new());
        assert!(state.pending.is_empty());
    }
}
