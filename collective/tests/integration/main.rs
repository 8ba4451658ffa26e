//! The collective's integration tests, one test binary: each file was a binary of its own, and each compiled the
//! collective's code it reaches again at the package's opt-level 2 (about 35 s apiece, 2026-12-01); one binary
//! compiles it once. The tests still run two at a time, as cargo's harness runs any binary's.

mod common;

mod abort_tree;
mod all_reduce;
mod compression;
mod failures;
mod kill;
mod security;
