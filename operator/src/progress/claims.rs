//! What a bearer token claims, read without checking its signature: the cheap first look that decides whether a
//! report is worth a TokenReview at all. A ServiceAccount token is a JWT whose payload names its audiences, its
//! expiry and, when it is bound to a pod, the pod (`kubernetes.io.pod`). Nothing read here is trusted: it only
//! selects which tokens the API server is asked about, and the review's answer must name the same pod.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rdu_crds::consts::PROGRESS_TOKEN_AUDIENCE;
use serde::Deserialize;

use super::token_review::PodIdentity;

/// The longest bearer token looked at (a projected ServiceAccount token is about 1 KiB).
pub(crate) const MAX_TOKEN_BYTES: usize = 8192;

/// Why a token is refused before anyone is asked about it; each says only what the token itself shows.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClaimsError {
    #[error(
        "the bearer token is not a ServiceAccount token (a JWT of at most {MAX_TOKEN_BYTES} bytes): send the projected progress token"
    )]
    NotAJwt,
    #[error("the token is for audiences {0:?}, not {PROGRESS_TOKEN_AUDIENCE}")]
    WrongAudience(Vec<String>),
    #[error("the token expired: the kubelet refreshes the projected token, read the file again")]
    Expired,
    #[error(
        "the token is not bound to a pod (mount a projected serviceAccountToken with audience {PROGRESS_TOKEN_AUDIENCE})"
    )]
    NotPodBound,
}

#[derive(Deserialize)]
struct Payload {
    #[serde(default)]
    aud: Audiences,
    exp: Option<i64>,
    #[serde(rename = "kubernetes.io")]
    kubernetes: Option<KubernetesClaims>,
}

/// `aud` is a string or a list of strings (RFC 7519, 4.1.3).
#[derive(Deserialize, Default)]
#[serde(untagged)]
enum Audiences {
    One(String),
    Many(Vec<String>),
    #[default]
    None,
}

#[derive(Deserialize)]
struct KubernetesClaims {
    namespace: String,
    pod: Option<ObjectClaim>,
}

#[derive(Deserialize)]
struct ObjectClaim {
    name: String,
    uid: String,
}

/// The pod `token` says it was issued to, if it is an unexpired pod-bound token for the progress audience at
/// `now` (Unix seconds); its signature is not checked.
pub(crate) fn claimed_pod(token: &str, now: i64) -> Result<PodIdentity, ClaimsError> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(ClaimsError::NotAJwt);
    }
    let mut parts = token.split('.');
    let (Some(_header), Some(payload), Some(_signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(ClaimsError::NotAJwt);
    };
    let bytes = URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .map_err(|_| ClaimsError::NotAJwt)?;
    let payload: Payload = serde_json::from_slice(&bytes).map_err(|_| ClaimsError::NotAJwt)?;
    let audiences = match payload.aud {
        Audiences::One(one) => vec![one],
        Audiences::Many(many) => many,
        Audiences::None => Vec::new(),
    };
    if !audiences.iter().any(|a| a == PROGRESS_TOKEN_AUDIENCE) {
        return Err(ClaimsError::WrongAudience(audiences));
    }
    if payload.exp.is_none_or(|exp| exp <= now) {
        return Err(ClaimsError::Expired);
    }
    let kubernetes = payload.kubernetes.ok_or(ClaimsError::NotPodBound)?;
    let pod = kubernetes.pod.ok_or(ClaimsError::NotPodBound)?;
    Ok(PodIdentity {
        namespace: kubernetes.namespace,
        pod_name: pod.name,
        pod_uid: pod.uid,
    })
}

/// Tokens shaped as the API server issues them, unsigned (for the endpoint's tests).
#[cfg(test)]
pub(crate) mod forged {
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;

    /// A token shaped as the API server issues them for `payload` (unsigned: a test or a forger's token).
    pub(crate) fn unsigned_token(payload: &serde_json::Value) -> String {
        let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"RS256","kid":"x"}"#);
        let payload = URL_SAFE_NO_PAD.encode(payload.to_string());
        format!("{header}.{payload}.c2lnbmF0dXJl")
    }

    /// The payload the API server writes into a token bound to pod `namespace/pod` (UID `uid`) for `audience`,
    /// expiring at `exp`.
    pub(crate) fn pod_token_payload(
        audience: &str,
        namespace: &str,
        pod: &str,
        uid: &str,
        exp: i64,
    ) -> serde_json::Value {
        serde_json::json!({
            "aud": [audience],
            "exp": exp,
            "iat": exp - 3600,
            "iss": "https://kubernetes.default.svc",
            "kubernetes.io": {
                "namespace": namespace,
                "pod": {"name": pod, "uid": uid},
                "serviceaccount": {"name": "default", "uid": "sa-uid"}
            },
            "nbf": exp - 3600,
            "sub": format!("system:serviceaccount:{namespace}:default"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::forged::{pod_token_payload, unsigned_token};
    use super::*;
    use serde_json::json;

    const NOW: i64 = 1_800_000_000;

    fn token(payload: serde_json::Value) -> String {
        unsigned_token(&payload)
    }

    #[test]
    fn a_pod_bound_progress_token_names_its_pod() {
        let payload = pod_token_payload(
            PROGRESS_TOKEN_AUDIENCE,
            "ml",
            "mnist-worker-0",
            "u0",
            NOW + 60,
        );
        assert_eq!(
            claimed_pod(&token(payload), NOW),
            Ok(PodIdentity {
                namespace: "ml".into(),
                pod_name: "mnist-worker-0".into(),
                pod_uid: "u0".into()
            })
        );
        let mut single = pod_token_payload(PROGRESS_TOKEN_AUDIENCE, "ml", "p", "u", NOW + 60);
        single["aud"] = json!(PROGRESS_TOKEN_AUDIENCE);
        assert!(claimed_pod(&token(single), NOW).is_ok(), "aud as a string");
    }

    #[test]
    fn what_the_token_itself_shows_is_refused_without_asking_anyone() {
        let bound =
            |audience: &str, exp: i64| token(pod_token_payload(audience, "ml", "p", "u", exp));
        let mut unbound = pod_token_payload(PROGRESS_TOKEN_AUDIENCE, "ml", "p", "u", NOW + 60);
        unbound["kubernetes.io"]
            .as_object_mut()
            .expect("claims")
            .remove("pod");
        let huge = format!("a.{}.c", "A".repeat(MAX_TOKEN_BYTES));
        let cases: [(String, ClaimsError); 9] = [
            ("not-a-token".into(), ClaimsError::NotAJwt),
            ("a.b".into(), ClaimsError::NotAJwt),
            ("a.b.c.d".into(), ClaimsError::NotAJwt),
            ("a.!!!.c".into(), ClaimsError::NotAJwt),
            (
                format!("a.{}.c", URL_SAFE_NO_PAD.encode("[1,2]")),
                ClaimsError::NotAJwt,
            ),
            (huge, ClaimsError::NotAJwt),
            (
                bound("https://kubernetes.default.svc", NOW + 60),
                ClaimsError::WrongAudience(vec!["https://kubernetes.default.svc".into()]),
            ),
            (bound(PROGRESS_TOKEN_AUDIENCE, NOW), ClaimsError::Expired),
            (token(unbound), ClaimsError::NotPodBound),
        ];
        for (token, error) in cases {
            assert_eq!(claimed_pod(&token, NOW), Err(error), "{token:.60}");
        }
    }
}
