//! The job token: a secret every collective call and the rendezvous must carry, made the same way by the operator,
//! local mode and the tests.

/// Bytes of randomness in a token (shown as twice as many hex digits).
pub const TOKEN_BYTES: usize = 32;

/// Why no token could be made.
#[derive(Debug, thiserror::Error)]
#[error("the operating system's random source failed: {0}")]
pub struct TokenError(pub String);

/// A fresh token: [`TOKEN_BYTES`] bytes from the operating system's random source, as lowercase hex.
pub fn new_token() -> Result<String, TokenError> {
    let mut bytes = [0u8; TOKEN_BYTES];
    getrandom::fill(&mut bytes).map_err(|e| TokenError(e.to_string()))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_long_random_hex() {
        let a = new_token().expect("token");
        assert_eq!(a.len(), 2 * TOKEN_BYTES);
        assert!(
            a.chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        assert_ne!(a, new_token().expect("token"));
    }
}
