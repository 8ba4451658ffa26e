//! `module-cycles [WORKSPACE]`: prints every import circle between the modules of one crate in
//! the workspace (default: the current directory) with where each use is written, and exits 1
//! if there is any (2 if the workspace cannot be read).

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let root = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    let report = match rdu_module_cycles::check(&root) {
        Ok(report) => report,
        Err(error) => {
            eprintln!("module-cycles: {error}");
            return ExitCode::from(2);
        }
    };
    for missing in &report.missing {
        eprintln!("module-cycles: no file for {missing} (skipped)");
    }
    for circle in &report.circles {
        print!("{circle}");
    }
    println!(
        "{} import circle(s) in {} crates ({} modules) of {}",
        report.circles.len(),
        report.crates,
        report.modules,
        root.display()
    );
    if report.circles.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
