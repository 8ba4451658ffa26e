//! `--compare-mpi`: the same sizes through Open MPI's `MPI_Allreduce` in the same run, once over its
//! shared-memory transport (`--mca btl vader,self`) and once over TCP (`--mca btl tcp,self`), where `mpicc` and
//! `mpirun` are on the PATH. The MPI program (`mpi/allreduce.c`, compiled here) times the calls as the bench
//! times its own ranks: warm-up, barrier, rank 0's mean over the timed calls.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The MPI side's source, built with `mpicc` into a temporary directory.
const SOURCE: &str = include_str!("../mpi/allreduce.c");

/// Open MPI's transports compared, by the name the bench's lines give them.
pub(crate) const TRANSPORTS: [(&str, &str); 2] =
    [("mpi_shared_memory", "vader,self"), ("mpi_tcp", "tcp,self")];

/// One size's result from the MPI program.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct MpiResult {
    pub bytes: u64,
    pub iters: u64,
    pub time_us: f64,
}

/// The MPI program, compiled for this run; removed when dropped.
pub(crate) struct MpiProgram {
    dir: PathBuf,
    exe: PathBuf,
}

impl MpiProgram {
    /// Compiles the program with `mpicc`; an error naming what is missing where Open MPI is not installed.
    pub(crate) fn build() -> Result<MpiProgram> {
        let dir = std::env::temp_dir().join(format!("allreduce-bench-mpi-{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let program = MpiProgram {
            exe: dir.join("allreduce"),
            dir,
        };
        let source = program.dir.join("allreduce.c");
        std::fs::write(&source, SOURCE).context("writing the MPI program")?;
        let status = Command::new("mpicc")
            .arg("-O2")
            .arg("-o")
            .arg(&program.exe)
            .arg(&source)
            .status()
            .context("running mpicc: --compare-mpi needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)")?;
        if !status.success() {
            bail!("mpicc failed ({status}) on {}", source.display());
        }
        Ok(program)
    }

    /// Runs `ranks` MPI ranks over `btl` for every `(bytes, iters, warmup)`, each bound to a core when
    /// `bind_to_core` (as the bench's own ranks then are), unbound otherwise.
    pub(crate) fn run(
        &self,
        ranks: u32,
        btl: &str,
        bind_to_core: bool,
        sizes: &[(u64, u64, u32)],
    ) -> Result<Vec<MpiResult>> {
        let binding = if bind_to_core { "core" } else { "none" };
        let output = Command::new("mpirun")
            .args([
                "--oversubscribe",
                "--bind-to",
                binding,
                "--mca",
                "btl",
                btl,
                "-np",
            ])
            .arg(ranks.to_string())
            .arg(&self.exe)
            .args(size_specs(sizes))
            // Open MPI refuses root without both; harmless otherwise.
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .output()
            .context("running mpirun")?;
        if !output.status.success() {
            bail!(
                "mpirun over {btl} failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
        }
        parse(&String::from_utf8_lossy(&output.stdout))
    }
}

impl Drop for MpiProgram {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The program's arguments: `bytes:iters:warmup` per size.
fn size_specs(sizes: &[(u64, u64, u32)]) -> Vec<String> {
    sizes
        .iter()
        .map(|(bytes, iters, warmup)| format!("{bytes}:{iters}:{warmup}"))
        .collect()
}

/// The program's JSON lines; anything else on its stdout (Open MPI's own notices) is skipped.
fn parse(stdout: &str) -> Result<Vec<MpiResult>> {
    stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line)
                .with_context(|| format!("MPI program printed {line}"))?;
            match (
                v["bytes"].as_u64(),
                v["iters"].as_u64(),
                v["time_us"].as_f64(),
            ) {
                (Some(bytes), Some(iters), Some(time_us)) => Ok(MpiResult {
                    bytes,
                    iters,
                    time_us,
                }),
                _ => bail!("MPI program printed a line without bytes, iters and time_us: {line}"),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_become_the_programs_arguments() {
        assert_eq!(
            size_specs(&[(4096, 2000, 3), (65536, 5, 0)]),
            ["4096:2000:3", "65536:5:0"]
        );
    }

    #[test]
    fn the_programs_lines_are_read_and_notices_skipped() {
        let out = "some notice from mpirun\n{\"bytes\":4096,\"iters\":2000,\"time_us\":3.961}\n\
                   {\"bytes\":65536,\"iters\":1000,\"time_us\":26.360}\n";
        assert_eq!(
            parse(out).expect("parsed"),
            [
                MpiResult {
                    bytes: 4096,
                    iters: 2000,
                    time_us: 3.961
                },
                MpiResult {
                    bytes: 65536,
                    iters: 1000,
                    time_us: 26.36
                }
            ]
        );
        assert!(
            parse("{\"bytes\":4096}\n").is_err(),
            "a line missing its time"
        );
    }
}
