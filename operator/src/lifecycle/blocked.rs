//! Why a pod of the job cannot start, read from its status: an image the kubelet cannot pull, a container it
//! cannot create, or a pod the scheduler cannot place. The lifecycle turns it into the `PodsBlocked` condition.

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};

/// Reasons of a waiting container that only the user can fix (a missing image, a bad env or volume reference).
pub(super) const CONTAINER_REASONS: [&str; 6] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "ErrImageNeverPull",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
];
/// Reason of the PodScheduled condition when no node fits the pod.
pub(super) const UNSCHEDULABLE: &str = "Unschedulable";
/// Reasons the kubelet alternates between while it retries one pull: the same problem, announced once.
const IMAGE_PULL: [&str; 2] = ["ErrImagePull", "ImagePullBackOff"];

/// What keeps one pod from starting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Blocked {
    /// The kubelet's or scheduler's reason, one of [`CONTAINER_REASONS`] or [`UNSCHEDULABLE`].
    pub reason: &'static str,
    /// The container that cannot start; none when the pod is not scheduled.
    pub container: Option<String>,
    /// The kubelet's or scheduler's message (the reason when it gave none).
    pub message: String,
}

/// The first thing keeping `pod` from starting: a waiting init or app container with one of
/// [`CONTAINER_REASONS`], else PodScheduled False with reason Unschedulable.
pub(super) fn blocked(pod: &Pod) -> Option<Blocked> {
    let status = pod.status.as_ref()?;
    status
        .init_container_statuses
        .iter()
        .chain(status.container_statuses.iter())
        .flatten()
        .find_map(waiting_on_user)
        .or_else(|| {
            let scheduled = status
                .conditions
                .iter()
                .flatten()
                .find(|c| c.type_ == "PodScheduled")?;
            (scheduled.status == "False" && scheduled.reason.as_deref() == Some(UNSCHEDULABLE))
                .then(|| Blocked {
                    reason: UNSCHEDULABLE,
                    container: None,
                    message: non_empty(scheduled.message.clone(), UNSCHEDULABLE),
                })
        })
}

fn waiting_on_user(container: &ContainerStatus) -> Option<Blocked> {
    let waiting = container.state.as_ref()?.waiting.as_ref()?;
    let reason = CONTAINER_REASONS
        .into_iter()
        .find(|r| waiting.reason.as_deref() == Some(*r))?;
    Some(Blocked {
        reason,
        container: Some(container.name.clone()),
        message: non_empty(waiting.message.clone(), reason),
    })
}

fn non_empty(message: Option<String>, fallback: &str) -> String {
    message
        .filter(|m| !m.trim().is_empty())
        .unwrap_or_else(|| fallback.to_string())
}

/// Whether a change of reason from `before` to `now` is news worth an event (a pull retry is not).
pub(super) fn is_new_problem(before: &str, now: &str) -> bool {
    before != now && !(IMAGE_PULL.contains(&before) && IMAGE_PULL.contains(&now))
}
