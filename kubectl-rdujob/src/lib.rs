//! `kubectl rdujob`: a cluster RduJob's status as a table of its ranks with progress and result, and its ranks'
//! logs merged with `[rank N]` prefixes as local mode prints them.

pub mod cluster;
pub mod logs;
pub mod status;
