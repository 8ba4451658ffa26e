//! The soak's faults, drawn from a seed: the same seed gives the same faults with the same targets, holds and
//! gaps. Kinds are dealt like cards, every kind once per round of [`FaultKind::ALL`] in an order the seed shuffles,
//! so a short soak meets every kind and a long one meets each as often as the others.

use std::time::Duration;

/// What the injector does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum FaultKind {
    /// Every process of a node killed at once (its container killed), booted again after the hold.
    NodeCrash,
    /// A node cut off the cluster's network for the hold, then connected again (a partition that heals).
    NodePartition,
    /// `systemctl restart kubelet` on a node.
    KubeletRestart,
    /// `systemctl restart containerd` on a node.
    ContainerdRestart,
    /// The device plugin's container SIGKILLed on a node.
    DevicePluginKilled,
    /// A rank's container SIGKILLed (the default rules restart the gang, counted).
    RankKilled,
    /// A rank's container OOM-killed by the kernel, in the job whose rule restarts on `OOMKilled` (counted).
    RankOomKilled,
    /// `kubectl drain` of a node, uncordoned after the hold.
    DrainUncordon,
    /// The operator's leading replica killed (two replicas: the other takes the Lease).
    OperatorLeaderKilled,
    /// The API server's static pod taken away for the hold, then put back.
    ApiServerRestarted,
    /// etcd SIGTERMed; the kubelet starts it again on the same data.
    EtcdRestarted,
    /// The scheduler SIGTERMed; the kubelet starts it again.
    SchedulerRestarted,
}

impl FaultKind {
    pub(crate) const ALL: [FaultKind; 12] = [
        FaultKind::NodeCrash,
        FaultKind::NodePartition,
        FaultKind::KubeletRestart,
        FaultKind::ContainerdRestart,
        FaultKind::DevicePluginKilled,
        FaultKind::RankKilled,
        FaultKind::RankOomKilled,
        FaultKind::DrainUncordon,
        FaultKind::OperatorLeaderKilled,
        FaultKind::ApiServerRestarted,
        FaultKind::EtcdRestarted,
        FaultKind::SchedulerRestarted,
    ];

    /// The name in the summary's `by_kind`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            FaultKind::NodeCrash => "node_crash",
            FaultKind::NodePartition => "node_partition",
            FaultKind::KubeletRestart => "kubelet_restart",
            FaultKind::ContainerdRestart => "containerd_restart",
            FaultKind::DevicePluginKilled => "device_plugin_killed",
            FaultKind::RankKilled => "rank_killed",
            FaultKind::RankOomKilled => "rank_oom_killed",
            FaultKind::DrainUncordon => "drain_uncordon",
            FaultKind::OperatorLeaderKilled => "operator_leader_killed",
            FaultKind::ApiServerRestarted => "api_server_restarted",
            FaultKind::EtcdRestarted => "etcd_restarted",
            FaultKind::SchedulerRestarted => "scheduler_restarted",
        }
    }

    /// Whether the API server is away for part of the fault (reconcile errors then are the fault's).
    pub(crate) fn takes_the_api_away(self) -> bool {
        matches!(
            self,
            FaultKind::ApiServerRestarted | FaultKind::EtcdRestarted
        )
    }
}

/// One fault as drawn: its kind and everything random about it. Which node or rank the draws land on is resolved
/// against the cluster when the fault comes (a rank's node is the scheduler's choice).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fault {
    pub(crate) kind: FaultKind,
    /// A node, 1-based.
    pub(crate) node: u8,
    /// A job slot (`jobs::SLOTS`); for an OOM kill, ignored (one slot has the rule).
    pub(crate) slot: usize,
    /// A draw for the rank, taken modulo the job's ranks.
    pub(crate) rank_draw: u32,
    /// How long a fault that heals stays (a crash, a partition, a drain, the API server away).
    pub(crate) hold: Duration,
    /// The quiet after the fault healed, before the next.
    pub(crate) gap: Duration,
}

/// The ranges the draws come from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ranges {
    pub(crate) nodes: u8,
    pub(crate) slots: usize,
    /// Hold, in whole seconds, inclusive.
    pub(crate) hold_seconds: (u64, u64),
    /// Gap, in whole seconds, inclusive.
    pub(crate) gap_seconds: (u64, u64),
}

/// `count` faults drawn from `seed`.
pub(crate) fn plan(seed: u64, count: usize, ranges: Ranges) -> Vec<Fault> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut deck: Vec<FaultKind> = Vec::new();
    (0..count)
        .map(|_| {
            if deck.is_empty() {
                deck = FaultKind::ALL.to_vec();
                rng.shuffle(&mut deck);
            }
            let kind = deck.pop().expect("a dealt kind");
            Fault {
                kind,
                node: rng.u8(1..=ranges.nodes),
                slot: rng.usize(..ranges.slots),
                rank_draw: rng.u32(..),
                hold: Duration::from_secs(rng.u64(ranges.hold_seconds.0..=ranges.hold_seconds.1)),
                gap: Duration::from_secs(rng.u64(ranges.gap_seconds.0..=ranges.gap_seconds.1)),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    const RANGES: Ranges = Ranges {
        nodes: 3,
        slots: 3,
        hold_seconds: (5, 20),
        gap_seconds: (1, 8),
    };

    fn counts(faults: &[Fault]) -> BTreeMap<FaultKind, usize> {
        let mut by_kind = BTreeMap::new();
        for f in faults {
            *by_kind.entry(f.kind).or_default() += 1;
        }
        by_kind
    }

    #[test]
    fn the_same_seed_replays_the_same_faults() {
        assert_eq!(plan(7, 40, RANGES), plan(7, 40, RANGES));
        assert_ne!(plan(7, 40, RANGES), plan(8, 40, RANGES));
        // A shorter soak of the same seed is the longer one's beginning.
        assert_eq!(plan(7, 40, RANGES)[..20], plan(7, 20, RANGES)[..]);
    }

    #[test]
    fn every_kind_comes_once_a_round() {
        for seed in 0..50 {
            let faults = plan(seed, FaultKind::ALL.len(), RANGES);
            assert!(
                counts(&faults).values().all(|&n| n == 1),
                "seed {seed}: {faults:?}"
            );
        }
        // The long soak: 200 faults, every kind at least 5 times (16 or 17 each).
        let by_kind = counts(&plan(3, 200, RANGES));
        assert_eq!(by_kind.len(), FaultKind::ALL.len());
        assert!(
            by_kind.values().all(|&n| (16..=17).contains(&n)),
            "{by_kind:?}"
        );
    }

    #[test]
    fn draws_stay_in_their_ranges() {
        for f in plan(11, 500, RANGES) {
            assert!((1..=3).contains(&f.node), "{f:?}");
            assert!(f.slot < 3, "{f:?}");
            assert!((5..=20).contains(&f.hold.as_secs()), "{f:?}");
            assert!((1..=8).contains(&f.gap.as_secs()), "{f:?}");
        }
    }

    #[test]
    fn the_order_is_shuffled_not_fixed() {
        let first = |seed| {
            plan(seed, 12, RANGES)
                .iter()
                .map(|f| f.kind)
                .collect::<Vec<_>>()
        };
        assert_ne!(first(1), first(2));
    }
}
