//! Test doubles shared by the integration tests.

pub mod fake_api;
