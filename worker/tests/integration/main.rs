//! The worker's integration tests, one test binary: each file was a binary of its own, and each compiled the
//! worker's code it reaches again at the package's opt-level 2 (about 45 s apiece, 2026-12-01); one binary
//! compiles it once. The tests still run two at a time, as cargo's harness runs any binary's.

mod common;

mod buckets_in_threads;
mod observers;
mod ranks_in_threads;
mod run_modes;
mod stop_and_resume;
mod tensorboard;
