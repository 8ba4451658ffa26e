//! How a data stream starts, on the collective port: a hello naming the sending rank, its
//! generation and the job token, and perhaps offering a shared-memory ring (see `shm`); then the
//! receiver's one-line reply, which says whether it took the ring. Chunk frames follow (`frame`),
//! on the stream or in the ring. Pure encoding and decoding, no I/O.

use crate::transport::shm::Offer;

/// First bytes of a data stream (the digit is the format's version). An HTTP/2 connection
/// starts with `PRI * HTTP/2.0`, so the first byte alone tells the two apart on the shared
/// collective port.
pub(crate) const MAGIC: &[u8; 8] = b"RDUCHNK3";
/// Longest job token a hello may carry (`CommConfig::validate` refuses longer ones).
pub(crate) const MAX_TOKEN: usize = crate::config::MAX_TOKEN_BYTES;
/// Hello bytes before the token: magic, from_rank (u32), generation (u64), token length (u16),
/// whether a ring offer (`Offer::LEN` bytes) follows the token (u8, 0 or 1).
pub(crate) const HELLO_FIXED: usize = 8 + 4 + 8 + 2 + 1;
/// Reply bytes before its message: status (u8, a gRPC code), whether the receiver took the
/// offered ring (u8, 0 or 1), message length (u16).
pub(crate) const REPLY_FIXED: usize = 4;

/// Why bytes from a peer are not a valid hello or reply.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum HelloError {
    #[error("stream does not start with the data-path magic {MAGIC:?}")]
    BadMagic,
    #[error("token of {0} bytes is longer than {MAX_TOKEN}")]
    TokenTooLong(usize),
    #[error("reply status {0} is not a gRPC code")]
    BadStatus(u8),
    #[error("flag byte {0} is neither 0 nor 1")]
    BadFlag(u8),
}

/// The fixed part of a hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HelloFixed {
    pub(crate) from_rank: u32,
    pub(crate) generation: u64,
    pub(crate) token_len: usize,
    /// A ring offer follows the token.
    pub(crate) offers_ring: bool,
}

/// The whole hello a sender writes after connecting.
pub(crate) fn encode_hello(
    from_rank: u32,
    generation: u64,
    token: &str,
    ring: Option<&Offer>,
) -> Result<Vec<u8>, HelloError> {
    let token_len =
        u16::try_from(token.len()).map_err(|_| HelloError::TokenTooLong(token.len()))?;
    if usize::from(token_len) > MAX_TOKEN {
        return Err(HelloError::TokenTooLong(token.len()));
    }
    let mut out = Vec::with_capacity(HELLO_FIXED + token.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&from_rank.to_le_bytes());
    out.extend_from_slice(&generation.to_le_bytes());
    out.extend_from_slice(&token_len.to_le_bytes());
    out.push(u8::from(ring.is_some()));
    out.extend_from_slice(token.as_bytes());
    if let Some(offer) = ring {
        out.extend_from_slice(&offer.encode());
    }
    Ok(out)
}

/// Reads the fixed part of a hello; the token (`token_len` bytes) and perhaps an offer follow it.
pub(crate) fn decode_hello(bytes: &[u8; HELLO_FIXED]) -> Result<HelloFixed, HelloError> {
    if &bytes[..8] != MAGIC {
        return Err(HelloError::BadMagic);
    }
    let token_len = usize::from(u16::from_le_bytes([bytes[20], bytes[21]]));
    if token_len > MAX_TOKEN {
        return Err(HelloError::TokenTooLong(token_len));
    }
    Ok(HelloFixed {
        from_rank: u32::from_le_bytes(array(&bytes[8..12])),
        generation: u64::from_le_bytes(array(&bytes[12..20])),
        token_len,
        offers_ring: flag(bytes[22])?,
    })
}

/// The receiver's answer to a hello: `Ok` or a refusal with the same code the gRPC path uses,
/// and whether frames go through the offered ring.
pub(crate) fn encode_reply(code: tonic::Code, took_ring: bool, message: &str) -> Vec<u8> {
    let message: String = message.chars().take(1024).collect();
    let mut out = Vec::with_capacity(REPLY_FIXED + message.len());
    out.push(code as u8);
    out.push(u8::from(took_ring));
    out.extend_from_slice(&(message.len() as u16).to_le_bytes());
    out.extend_from_slice(message.as_bytes());
    out
}

/// A reply's fixed part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reply {
    pub(crate) code: tonic::Code,
    pub(crate) took_ring: bool,
    /// Bytes of the message that follows.
    pub(crate) message_len: usize,
}

/// Status, ring answer and message length of a reply; the message follows.
pub(crate) fn decode_reply(bytes: &[u8; REPLY_FIXED]) -> Result<Reply, HelloError> {
    let code = bytes[0];
    if code > tonic::Code::Unauthenticated as u8 {
        return Err(HelloError::BadStatus(code));
    }
    Ok(Reply {
        code: tonic::Code::from(i32::from(code)),
        took_ring: flag(bytes[1])?,
        message_len: usize::from(u16::from_le_bytes([bytes[2], bytes[3]])),
    })
}

fn flag(byte: u8) -> Result<bool, HelloError> {
    match byte {
        0 => Ok(false),
        1 => Ok(true),
        other => Err(HelloError::BadFlag(other)),
    }
}

/// A fixed-size copy of `bytes` (callers slice exactly `N` bytes).
fn array<const N: usize>(bytes: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(bytes);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trips_and_is_recognised_by_its_first_byte() {
        let hello = encode_hello(3, 9, "tok", None).unwrap();
        assert_eq!(hello.len(), HELLO_FIXED + 3);
        assert_ne!(hello[0], b"PRI * HTTP/2.0"[0]);
        let fixed = decode_hello(hello[..HELLO_FIXED].try_into().unwrap()).unwrap();
        assert_eq!(
            fixed,
            HelloFixed {
                from_rank: 3,
                generation: 9,
                token_len: 3,
                offers_ring: false,
            }
        );
        assert_eq!(&hello[HELLO_FIXED..], b"tok");
    }

    #[test]
    fn a_ring_offer_follows_the_token() {
        let offer = Offer {
            server: [1; 16],
            nonce: [2; 16],
        };
        let hello = encode_hello(0, 1, "tok", Some(&offer)).unwrap();
        assert_eq!(hello.len(), HELLO_FIXED + 3 + Offer::LEN);
        let fixed = decode_hello(hello[..HELLO_FIXED].try_into().unwrap()).unwrap();
        assert!(fixed.offers_ring);
        let after_token = &hello[HELLO_FIXED + 3..];
        assert_eq!(Offer::decode(after_token.try_into().unwrap()), offer);
    }

    #[test]
    fn hostile_hellos_are_refused() {
        let mut hello = encode_hello(0, 1, "t", None).unwrap();
        hello[0] = b'X';
        assert_eq!(
            decode_hello(hello[..HELLO_FIXED].try_into().unwrap()),
            Err(HelloError::BadMagic)
        );
        let mut long = encode_hello(0, 1, "t", None).unwrap();
        long[20..22].copy_from_slice(&u16::MAX.to_le_bytes());
        assert_eq!(
            decode_hello(long[..HELLO_FIXED].try_into().unwrap()),
            Err(HelloError::TokenTooLong(usize::from(u16::MAX)))
        );
        let mut flagged = encode_hello(0, 1, "t", None).unwrap();
        flagged[22] = 7;
        assert_eq!(
            decode_hello(flagged[..HELLO_FIXED].try_into().unwrap()),
            Err(HelloError::BadFlag(7))
        );
        assert!(encode_hello(0, 1, &"x".repeat(MAX_TOKEN + 1), None).is_err());
    }

    #[test]
    fn replies_carry_the_code_the_ring_answer_and_message() {
        let reply = encode_reply(tonic::Code::FailedPrecondition, false, "stale");
        let fixed = decode_reply(reply[..REPLY_FIXED].try_into().unwrap()).unwrap();
        assert_eq!(
            fixed,
            Reply {
                code: tonic::Code::FailedPrecondition,
                took_ring: false,
                message_len: 5
            }
        );
        assert_eq!(&reply[REPLY_FIXED..], b"stale");
        let took = encode_reply(tonic::Code::Ok, true, "");
        assert!(
            decode_reply(took[..].try_into().unwrap())
                .unwrap()
                .took_ring
        );
        assert_eq!(
            decode_reply(&[200, 0, 0, 0]),
            Err(HelloError::BadStatus(200))
        );
        assert_eq!(decode_reply(&[0, 2, 0, 0]), Err(HelloError::BadFlag(2)));
    }
}
