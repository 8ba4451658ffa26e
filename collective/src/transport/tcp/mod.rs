//! The raw TCP data path beside gRPC: chunks travel on one plain TCP stream per directed pair of
//! ranks (after the hello, see `hello`), as header + payload frames (`frame`), on the same port
//! as the `Collective` gRPC server. Compared with a gRPC stream this skips protobuf's payload
//! copy and tonic's re-buffering of HTTP/2 frames on both ends: the sender writes its values
//! straight to the socket (`link`), and the receiving collective reads each chunk straight into
//! the values it updates (`receive`).

mod link;
mod receive;

pub(crate) use link::TcpLink;
pub(crate) use receive::TcpSource;
