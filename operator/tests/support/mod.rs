//! Test doubles shared by the integration tests.

// Each test binary compiles this module and uses only part of the fake and the harness.
#[allow(dead_code)]
pub(crate) mod fake_api;
#[allow(dead_code)]
pub(crate) mod harness;
