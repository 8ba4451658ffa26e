//! Who sent a progress report: the API server's TokenReview of the caller's bearer token, for the progress
//! audience only, narrowed to the pod the token is bound to. Which tokens are reviewed, how many at once and
//! what is remembered of the answers is `super::review_cache`.

use futures::future::BoxFuture;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use kube::api::{Api, PostParams};
use rdu_crds::consts::PROGRESS_TOKEN_AUDIENCE;

const POD_NAME_EXTRA: &str = "authentication.kubernetes.io/pod-name";
const POD_UID_EXTRA: &str = "authentication.kubernetes.io/pod-uid";
const SERVICE_ACCOUNT_PREFIX: &str = "system:serviceaccount:";

/// The pod a token was issued to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodIdentity {
    pub namespace: String,
    pub pod_name: String,
    pub pod_uid: String,
}

/// Why a token does not identify a pod.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReviewError {
    #[error("the token was not accepted for audience {PROGRESS_TOKEN_AUDIENCE}: {0}")]
    Rejected(String),
    #[error(
        "the token is not a pod-bound ServiceAccount token (mount a projected serviceAccountToken with audience {PROGRESS_TOKEN_AUDIENCE})"
    )]
    NotPodBound,
    #[error("cannot review the token with the API server: {0}")]
    Unavailable(String),
}

/// Reviews bearer tokens: the API server in the operator, a table in tests.
pub trait TokenReviewer: Send + Sync {
    fn review<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<PodIdentity, ReviewError>>;
}

/// The pod a successful review names, if the token was for the progress audience and bound to a pod.
pub(crate) fn identity_from(status: &TokenReviewStatus) -> Result<PodIdentity, ReviewError> {
    if status.authenticated != Some(true) {
        let why = status
            .error
            .clone()
            .unwrap_or_else(|| "not authenticated".to_string());
        return Err(ReviewError::Rejected(why));
    }
    let audiences = status.audiences.as_deref().unwrap_or_default();
    if !audiences.iter().any(|a| a == PROGRESS_TOKEN_AUDIENCE) {
        return Err(ReviewError::Rejected(format!("audiences {audiences:?}")));
    }
    let user = status.user.as_ref().ok_or(ReviewError::NotPodBound)?;
    let namespace = user
        .username
        .as_deref()
        .and_then(|u| u.strip_prefix(SERVICE_ACCOUNT_PREFIX))
        .and_then(|rest| rest.split_once(':'))
        .map(|(ns, _account)| ns.to_string())
        .ok_or(ReviewError::NotPodBound)?;
    let extra = |key: &str| {
        user.extra
            .as_ref()
            .and_then(|e| e.get(key))
            .and_then(|values| match values.as_slice() {
                [one] if !one.is_empty() => Some(one.clone()),
                _ => None,
            })
            .ok_or(ReviewError::NotPodBound)
    };
    Ok(PodIdentity {
        namespace,
        pod_name: extra(POD_NAME_EXTRA)?,
        pod_uid: extra(POD_UID_EXTRA)?,
    })
}

/// Reviews tokens with the API server's TokenReview API (RBAC: `create tokenreviews`), one request per call.
pub struct ApiTokenReviewer {
    client: kube::Client,
}

impl ApiTokenReviewer {
    pub fn new(client: kube::Client) -> Self {
        ApiTokenReviewer { client }
    }
}

impl TokenReviewer for ApiTokenReviewer {
    fn review<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<PodIdentity, ReviewError>> {
        Box::pin(async move {
            let review = TokenReview {
                spec: TokenReviewSpec {
                    token: Some(token.to_string()),
                    audiences: Some(vec![PROGRESS_TOKEN_AUDIENCE.to_string()]),
                },
                ..Default::default()
            };
            let reviews: Api<TokenReview> = Api::all(self.client.clone());
            let answer = reviews
                .create(&PostParams::default(), &review)
                .await
                .map_err(|e| ReviewError::Unavailable(e.to_string()))?;
            identity_from(&answer.status.unwrap_or_default())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::authentication::v1::UserInfo;
    use std::collections::BTreeMap;

    fn reviewed(audience: &str, extra: &[(&str, &str)]) -> TokenReviewStatus {
        TokenReviewStatus {
            authenticated: Some(true),
            audiences: Some(vec![audience.to_string()]),
            user: Some(UserInfo {
                username: Some("system:serviceaccount:ml:default".to_string()),
                extra: Some(
                    extra
                        .iter()
                        .map(|(k, v)| (k.to_string(), vec![v.to_string()]))
                        .collect::<BTreeMap<_, _>>(),
                ),
                ..Default::default()
            }),
            error: None,
        }
    }

    #[test]
    fn a_pod_bound_token_names_its_namespace_pod_and_uid() {
        let status = reviewed(
            PROGRESS_TOKEN_AUDIENCE,
            &[(POD_NAME_EXTRA, "mnist-worker-0"), (POD_UID_EXTRA, "u-1")],
        );
        assert_eq!(
            identity_from(&status),
            Ok(PodIdentity {
                namespace: "ml".into(),
                pod_name: "mnist-worker-0".into(),
                pod_uid: "u-1".into()
            })
        );
    }

    #[test]
    fn other_audiences_unbound_tokens_and_failed_reviews_are_refused() {
        let bound = [(POD_NAME_EXTRA, "p"), (POD_UID_EXTRA, "u")];
        assert!(matches!(
            identity_from(&reviewed("https://kubernetes.default.svc", &bound)),
            Err(ReviewError::Rejected(_))
        ));
        assert_eq!(
            identity_from(&reviewed(PROGRESS_TOKEN_AUDIENCE, &[])),
            Err(ReviewError::NotPodBound)
        );
        let mut failed = reviewed(PROGRESS_TOKEN_AUDIENCE, &bound);
        failed.authenticated = Some(false);
        failed.error = Some("token expired".into());
        assert_eq!(
            identity_from(&failed),
            Err(ReviewError::Rejected("token expired".into()))
        );
        let mut user_token = reviewed(PROGRESS_TOKEN_AUDIENCE, &bound);
        user_token.user.as_mut().expect("user").username = Some("alice".into());
        assert_eq!(identity_from(&user_token), Err(ReviewError::NotPodBound));
    }
}
