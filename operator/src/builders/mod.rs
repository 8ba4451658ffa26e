//! Pure builders of an RduJob's children: no client in scope, same input gives the same objects.

pub mod env;
#[cfg(test)]
pub(crate) mod test_fixtures;

pub use env::{RankPlacement, job_name, job_namespace, rank_env};
