//! The job token on every call: added by clients, checked by servers (UNAUTHENTICATED otherwise).

use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::{Request, Status};

/// Metadata key carrying `Bearer <token>`.
pub const AUTHORIZATION: &str = "authorization";

/// Server side: refuses every call whose `authorization` is not `Bearer <token>`.
#[derive(Clone)]
pub struct RequireToken {
    expected: String,
}

impl RequireToken {
    pub fn new(token: &str) -> Self {
        RequireToken {
            expected: format!("Bearer {token}"),
        }
    }

    /// Plain check, also used by tests without a server.
    pub fn check<T>(&self, request: &Request<T>) -> Result<(), Status> {
        let presented = request
            .metadata()
            .get(AUTHORIZATION)
            .ok_or_else(|| Status::unauthenticated("missing job token (authorization metadata)"))?;
        if constant_time_eq(presented.as_bytes(), self.expected.as_bytes()) {
            Ok(())
        } else {
            Err(Status::unauthenticated("wrong job token"))
        }
    }
}

impl RequireToken {
    /// True when `token` (raw, without `Bearer `) is the job token; for the TCP data path.
    pub(crate) fn accepts(&self, token: &[u8]) -> bool {
        let mut presented = Vec::with_capacity(7 + token.len());
        presented.extend_from_slice(b"Bearer ");
        presented.extend_from_slice(token);
        constant_time_eq(&presented, self.expected.as_bytes())
    }
}

impl Interceptor for RequireToken {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        self.check(&request)?;
        Ok(request)
    }
}

/// Client side: adds `authorization: Bearer <token>` to every call.
#[derive(Clone)]
pub struct AttachToken {
    value: MetadataValue<tonic::metadata::Ascii>,
}

impl AttachToken {
    /// Fails when the token holds characters not allowed in a header value.
    pub fn new(token: &str) -> Result<Self, crate::CollectiveError> {
        let value = format!("Bearer {token}").parse().map_err(|_| {
            crate::CollectiveError::invalid_config(
                "identity.token",
                "must be printable ASCII (it is sent as a header value)",
            )
        })?;
        Ok(AttachToken { value })
    }
}

impl Interceptor for AttachToken {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        request
            .metadata_mut()
            .insert(AUTHORIZATION, self.value.clone());
        Ok(request)
    }
}

/// Compares without an early exit on the first differing byte.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_token(value: Option<&str>) -> Request<()> {
        let mut r = Request::new(());
        if let Some(v) = value {
            r.metadata_mut()
                .insert(AUTHORIZATION, v.parse().expect("ascii test value"));
        }
        r
    }

    #[test]
    fn right_token_passes_and_others_are_unauthenticated() {
        let guard = RequireToken::new("s3cret");
        assert!(guard.check(&with_token(Some("Bearer s3cret"))).is_ok());
        for bad in [
            None,
            Some("Bearer nope"),
            Some("s3cret"),
            Some("Bearer s3cret2"),
        ] {
            let err = guard.check(&with_token(bad)).expect_err("must refuse");
            assert_eq!(err.code(), tonic::Code::Unauthenticated, "{bad:?}");
        }
    }

    #[test]
    fn attached_token_is_accepted_by_the_guard() {
        let mut attach = AttachToken::new("tok").expect("ascii");
        let r = attach.call(Request::new(())).expect("attach");
        assert!(RequireToken::new("tok").check(&r).is_ok());
        assert!(AttachToken::new("bad\ntoken").is_err());
    }
}
