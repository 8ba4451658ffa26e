//! The rdujob command line.
fn main() {}
