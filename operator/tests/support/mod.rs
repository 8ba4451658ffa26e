//! Test doubles shared by the integration tests.

// Each test binary compiles this module and uses only part of the fake.
#[allow(dead_code)]
pub mod fake_api;
