//! Sets of exit codes: what `spec.runPolicy.failurePolicy`'s matchers accept, for the failure rules (which rank's
//! exit a rule matches) and validation (which rules overlap).

use crate::consts::exit_code;
use crate::{ExitCodeMatcher, ExitCodeOperator, FailureRule};

/// A set of exit codes 0–255.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CodeSet([u64; 4]);

impl CodeSet {
    /// Every failing code, 1–255.
    pub fn failures() -> Self {
        let mut set = CodeSet([u64::MAX; 4]);
        set.0[0] &= !1;
        set
    }

    pub fn insert(&mut self, code: i32) {
        if let Ok(code @ 0..=255) = u8::try_from(code).map(usize::from) {
            self.0[code / 64] |= 1 << (code % 64);
        }
    }

    pub fn contains(&self, code: i32) -> bool {
        match u8::try_from(code).map(usize::from) {
            Ok(code) => self.0[code / 64] & (1 << (code % 64)) != 0,
            Err(_) => false,
        }
    }

    pub fn intersection(self, other: CodeSet) -> CodeSet {
        CodeSet(std::array::from_fn(|i| self.0[i] & other.0[i]))
    }

    /// The failing codes not in this set.
    pub fn other_failures(self) -> CodeSet {
        CodeSet(std::array::from_fn(|i| !self.0[i])).intersection(CodeSet::failures())
    }

    pub fn is_empty(&self) -> bool {
        self.0 == [0; 4]
    }

    pub fn is_subset(&self, of: &CodeSet) -> bool {
        self.intersection(*of) == *self
    }
}

impl ExitCodeMatcher {
    /// `values` and `ranges` together (codes outside 0–255 left out).
    pub fn listed(&self) -> CodeSet {
        let mut set = CodeSet::default();
        for &code in &self.values {
            set.insert(code);
        }
        for range in &self.ranges {
            for code in range.from.max(0)..=range.to.min(255) {
                set.insert(code);
            }
        }
        set
    }

    /// The failing codes (1–255) this matcher accepts.
    pub fn accepted(&self) -> CodeSet {
        match self.operator {
            ExitCodeOperator::In => self.listed().intersection(CodeSet::failures()),
            ExitCodeOperator::NotIn => self.listed().other_failures(),
        }
    }
}

impl FailureRule {
    /// The failing exit codes `onExitCodes` and `onSignals` together accept; none when neither is set (the rule
    /// then matches ranks without an exit code too).
    pub fn exit_codes(&self) -> Option<CodeSet> {
        let codes = self.on_exit_codes.as_ref().map(ExitCodeMatcher::accepted);
        let signals = self.on_signals.as_ref().map(|signals| {
            let mut set = CodeSet::default();
            for &signal in signals {
                if (1..=64).contains(&signal) {
                    set.insert(exit_code::SIGNAL_BASE + signal);
                }
            }
            set
        });
        match (codes, signals) {
            (Some(c), Some(s)) => Some(c.intersection(s)),
            (c, s) => c.or(s),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_sets_hold_0_to_255_only() {
        let mut set = CodeSet::default();
        for code in [0, 64, 255, 256, -1] {
            set.insert(code);
        }
        assert!(set.contains(0) && set.contains(64) && set.contains(255));
        assert!(!set.contains(256) && !set.contains(-1) && !set.contains(1));
        let others = set.other_failures();
        assert!(!others.contains(0) && !others.contains(64) && others.contains(1));
        assert!(CodeSet::failures().other_failures().is_empty());
        assert!(set.intersection(others).is_empty());
        assert!(others.is_subset(&CodeSet::failures()));
    }
}
