//! Leader election over a coordination.k8s.io/v1 Lease: acquire, renew, release. Only the holder reconciles, and
//! only its pod carries the leader label the progress Service selects.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};

/// How long a lease holds without renewal.
pub(crate) const LEASE_SECONDS: i32 = 15;
/// How often the holder renews.
pub(crate) const RENEW_EVERY: Duration = Duration::from_secs(5);

/// The label the leading replica puts on its own pod. The progress Service selects it: a standby is ready (so a
/// rolling update can replace the leader) but takes no reports, so reports must reach the leader alone.
pub const LEADER_LABEL: &str = "rdu.dev/operator-leader";
/// The field manager of the leader label, apart from the operator's own so that applying without it removes it.
const LEADER_LABEL_MANAGER: &str = "rdu-operator-leader-label";

/// Why the lease could not be taken or kept.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("Lease API call failed")]
    Kube(#[from] kube::Error),
    #[error("lost the lease {name} to {holder:?}")]
    Lost {
        name: String,
        holder: Option<String>,
    },
}

/// One contender for a named Lease.
pub struct LeaderElector {
    api: Api<Lease>,
    name: String,
    identity: String,
}

/// Whether a lease is free for `identity` at `now`: unheld, held by itself, or expired.
pub(crate) fn can_take(spec: Option<&LeaseSpec>, identity: &str, now: Timestamp) -> bool {
    let Some(spec) = spec else { return true };
    match spec.holder_identity.as_deref() {
        None | Some("") => true,
        Some(holder) if holder == identity => true,
        Some(_) => {
            let seconds = i64::from(spec.lease_duration_seconds.unwrap_or(LEASE_SECONDS));
            let renewed = spec
                .renew_time
                .as_ref()
                .map(|t| t.0.as_second())
                .unwrap_or(0);
            renewed + seconds < now.as_second()
        }
    }
}

impl LeaderElector {
    pub fn new(client: Client, namespace: &str, name: &str, identity: &str) -> Self {
        LeaderElector {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
            identity: identity.to_string(),
        }
    }

    fn spec(&self, now: Timestamp, acquired: Option<MicroTime>, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(LEASE_SECONDS),
            acquire_time: Some(acquired.unwrap_or(MicroTime(now))),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    /// One attempt to take or renew the lease; Ok(true) when this identity holds it afterwards.
    pub async fn try_acquire(&self) -> Result<bool, LeaseError> {
        let now = Timestamp::now();
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..Default::default()
                },
                spec: Some(self.spec(now, None, 0)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e.into()),
            };
        };
        if !can_take(lease.spec.as_ref(), &self.identity, now) {
            return Ok(false);
        }
        let old = lease.spec.take().unwrap_or_default();
        let ours = old.holder_identity.as_deref() == Some(self.identity.as_str());
        let transitions = old.lease_transitions.unwrap_or(0) + i32::from(!ours);
        let acquired = if ours { old.acquire_time } else { None };
        lease.spec = Some(self.spec(now, acquired, transitions));
        // replace carries the resourceVersion: a racing contender gets a conflict, not a split brain.
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Waits until this identity holds the lease.
    pub async fn acquire(&self) -> Result<(), LeaseError> {
        loop {
            if self.try_acquire().await? {
                return Ok(());
            }
            tokio::time::sleep(RENEW_EVERY / 2).await;
        }
    }

    /// Renews until the lease is lost or cannot be renewed within its duration; returns why.
    pub async fn keep(&self) -> LeaseError {
        let mut last_renewed = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(RENEW_EVERY).await;
            match self.try_acquire().await {
                Ok(true) => last_renewed = tokio::time::Instant::now(),
                Ok(false) => {
                    let holder = self
                        .api
                        .get_opt(&self.name)
                        .await
                        .ok()
                        .flatten()
                        .and_then(|l| l.spec.and_then(|s| s.holder_identity));
                    return LeaseError::Lost {
                        name: self.name.clone(),
                        holder,
                    };
                }
                Err(e) if last_renewed.elapsed() > Duration::from_secs(LEASE_SECONDS as u64) => {
                    return e;
                }
                Err(_) => {}
            }
        }
    }

    /// Gives the lease up so another replica takes over at once.
    pub async fn release(&self) -> Result<(), LeaseError> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(());
        };
        let Some(spec) = lease.spec.as_mut() else {
            return Ok(());
        };
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.renew_time = None;
        spec.acquire_time = None;
        self.api
            .replace(&self.name, &PostParams::default(), &lease)
            .await?;
        Ok(())
    }
}

/// This replica's own pod, labelled with [`LEADER_LABEL`] while it leads.
pub struct OwnPod {
    api: Api<Pod>,
    name: String,
}

impl OwnPod {
    pub fn new(client: Client, namespace: &str, name: &str) -> Self {
        OwnPod {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
        }
    }

    /// Puts the leader label on the pod (true) or takes it off (false), by server-side apply under a field
    /// manager of its own: applying no label removes the one it set, and touches nothing else of the pod.
    pub async fn mark_leading(&self, leading: bool) -> Result<(), kube::Error> {
        let labels = if leading {
            serde_json::json!({ LEADER_LABEL: "true" })
        } else {
            serde_json::json!({})
        };
        let pod = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": { "name": self.name, "labels": labels },
        });
        let params = PatchParams::apply(LEADER_LABEL_MANAGER).force();
        self.api
            .patch(&self.name, &params, &Patch::Apply(&pod))
            .await?;
        Ok(())
    }

    /// Labels the pod as the leader's, retrying until the API server takes it: without the label no progress
    /// report reaches this replica.
    pub async fn label_until_done(&self) {
        let mut delay = Duration::from_millis(500);
        while let Err(error) = self.mark_leading(true).await {
            tracing::warn!(error = %rdu_error_chain::Chain(&error), "could not label this replica's pod as the leader's; retrying");
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(10));
        }
        tracing::info!("labelled this replica's pod as the leader's");
    }

    /// Takes the leader label off, or says why it could not (a label left on a standby is taken off when it next
    /// starts).
    pub async fn unlabel(&self) {
        if let Err(error) = self.mark_leading(false).await {
            tracing::warn!(error = %rdu_error_chain::Chain(&error), "could not take the leader label off this replica's pod");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(by: &str, renewed: i64) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(by.to_string()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(Timestamp::from_second(renewed).expect("t"))),
            ..Default::default()
        }
    }

    #[test]
    fn lease_is_free_when_unheld_own_or_expired() {
        let now = Timestamp::from_second(1_000).expect("t");
        assert!(can_take(None, "a", now));
        assert!(can_take(Some(&LeaseSpec::default()), "a", now));
        assert!(can_take(Some(&held("a", 999)), "a", now));
        assert!(!can_take(Some(&held("b", 990)), "a", now));
        assert!(can_take(Some(&held("b", 980)), "a", now));
    }
}
