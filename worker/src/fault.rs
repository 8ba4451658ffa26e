//! Test fault injection (as the device plugin's health file): two env flags a test sets on the worker container,
//! or on `rdujob run` (whose ranks inherit its env), to make a rank fail the way real ranks do where no test can
//! reach: stop making progress without exiting (`RDU_TEST_HANG_AT_STEP`), or use more memory than its container
//! may (`RDU_TEST_ALLOCATE_MIB`). Not part of the spec; never set them in production.

use rdu_crds::consts::env;

use crate::error::WorkerError;

/// Most MiB `RDU_TEST_ALLOCATE_MIB` may ask for: enough to pass any test's memory limit, not to exhaust a machine.
pub(crate) const MAX_ALLOCATE_MIB: u64 = 4096;

/// The faults this rank was asked to show.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    /// In generation 0, hang after this train step (so the restarted gang gets past it).
    pub hang_at_step: Option<u64>,
    /// Allocate and touch this many MiB before loading the data.
    pub allocate_mib: Option<u64>,
}

impl Faults {
    /// The flags read through `get`; a value that is not a number (or too large) is a config error naming it.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Faults, WorkerError> {
        let number = |var: &str| -> Result<Option<u64>, WorkerError> {
            get(var)
                .map(|v| {
                    v.trim().parse::<u64>().map_err(|_| {
                        WorkerError::config(
                            var,
                            format!("{v:?} is not a whole number (test fault injection); unset it"),
                        )
                    })
                })
                .transpose()
        };
        let allocate_mib = number(env::TEST_ALLOCATE_MIB)?;
        if let Some(mib) = allocate_mib.filter(|m| *m > MAX_ALLOCATE_MIB) {
            return Err(WorkerError::config(
                env::TEST_ALLOCATE_MIB,
                format!("{mib} MiB is more than the {MAX_ALLOCATE_MIB} MiB a test may allocate"),
            ));
        }
        Ok(Faults {
            hang_at_step: number(env::TEST_HANG_AT_STEP)?,
            allocate_mib,
        })
    }

    /// Whether a rank of `generation` that just finished `step` hangs now.
    pub fn hangs_after(&self, generation: u32, step: u64) -> bool {
        generation == 0 && self.hang_at_step == Some(step)
    }

    /// The allocation asked for, every page written so that it is resident (and counted by a memory limit).
    pub fn allocate(&self) -> Vec<u8> {
        let Some(mib) = self.allocate_mib else {
            return Vec::new();
        };
        let bytes = usize::try_from(mib << 20).unwrap_or(usize::MAX);
        tracing::warn!(
            mib,
            "{}: allocating past the memory limit (test fault injection)",
            env::TEST_ALLOCATE_MIB
        );
        let mut ballast = vec![0u8; bytes];
        for page in ballast.chunks_mut(4096) {
            page[0] = 1;
        }
        ballast
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(vars: &[(&str, &str)]) -> Result<Faults, WorkerError> {
        Faults::from_vars(|k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn the_flags_are_read_checked_and_hang_only_the_first_generation() {
        assert_eq!(read(&[]).unwrap(), Faults::default());
        let f = read(&[
            (env::TEST_HANG_AT_STEP, "12"),
            (env::TEST_ALLOCATE_MIB, "3"),
        ])
        .unwrap();
        assert!(f.hangs_after(0, 12));
        assert!(!f.hangs_after(0, 11) && !f.hangs_after(1, 12));
        assert_eq!(f.allocate().len(), 3 << 20);
        for (var, value) in [
            (env::TEST_HANG_AT_STEP, "soon"),
            (env::TEST_ALLOCATE_MIB, "-1"),
            (env::TEST_ALLOCATE_MIB, "4097"),
        ] {
            let e = read(&[(var, value)]).unwrap_err().to_string();
            assert!(e.contains(var), "{e}");
        }
    }
}
