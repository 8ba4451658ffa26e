//! What `rdujob run` shows a person (DESIGN 6): its own `[rdujob]` notes, one progress line fed by rank 0 (an
//! indicatif bar on a terminal, a plain line every few seconds otherwise), and of the ranks' logs only warnings
//! and errors, `[rank N]`-prefixed. Verbose (`-v`, or `RUST_LOG` set) prints every rank's every line as before.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rdu_crds::TrainingProgress;

/// Plain progress lines (no terminal) come at most this often, or at each 10% step.
pub(crate) const PLAIN_INTERVAL: Duration = Duration::from_secs(5);

/// The terminal (or log) a local run writes to.
pub(crate) struct Console {
    verbose: bool,
    bar: Option<ProgressBar>,
    plain: Mutex<Option<(Instant, u32)>>,
}

impl std::fmt::Debug for Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console")
            .field("verbose", &self.verbose)
            .field("bar", &self.bar.is_some())
            .finish()
    }
}

impl Console {
    /// A console on stderr: a bar when stderr is a terminal and not `verbose`.
    pub(crate) fn new(verbose: bool) -> Self {
        let bar = (!verbose && std::io::stderr().is_terminal()).then(|| {
            let bar = ProgressBar::with_draw_target(Some(1), ProgressDrawTarget::stderr());
            if let Ok(style) = ProgressStyle::with_template("{bar:30} {pos}/{len} steps {msg}") {
                bar.set_style(style);
            }
            bar
        });
        Console {
            verbose,
            bar,
            plain: Mutex::new(None),
        }
    }

    /// Whether every rank line is shown.
    pub(crate) fn verbose(&self) -> bool {
        self.verbose
    }

    /// A note of `rdujob` itself, always shown.
    pub(crate) fn note(&self, text: &str) {
        self.print(&format!("[rdujob] {text}"));
    }

    /// A line of rank `rank`'s log: shown when verbose, or when it is a warning or an error.
    pub(crate) fn rank_line(&self, rank: u32, line: &str) {
        if self.verbose || is_warning_or_error(line) {
            self.print(&format!("[rank {rank}] {line}"));
        }
    }

    /// A line of rank `rank`'s that `rdujob` shows in another form: printed as it is only when verbose.
    pub(crate) fn detail(&self, rank: u32, line: &str) {
        if self.verbose {
            self.print(&format!("[rank {rank}] {line}"));
        }
    }

    /// Rank 0's progress: the bar moves, or a plain line when one is due.
    pub(crate) fn progress(&self, p: &TrainingProgress) {
        if self.verbose {
            return;
        }
        let text = progress_text(p);
        if let Some(bar) = &self.bar {
            bar.set_length(p.total_steps);
            bar.set_position(p.step);
            bar.set_message(text);
            return;
        }
        let mut last = self.plain.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if plain_line_due(*last, now, p) {
            *last = Some((now, p.percent));
            eprintln!("[rdujob] {text}");
        }
    }

    /// Removes the bar before the result is printed.
    pub(crate) fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }

    fn print(&self, line: &str) {
        match &self.bar {
            Some(bar) if !bar.is_hidden() => bar.println(line),
            _ => eprintln!("{line}"),
        }
    }
}

/// Whether a line of a rank's tracing output is a warning or an error (`<time>  WARN …`, `<time> ERROR …`), or
/// not a tracing line at all (a panic, a message from the runtime): those are never hidden.
pub(crate) fn is_warning_or_error(line: &str) -> bool {
    let mut words = line.split_whitespace();
    let (Some(time), Some(level)) = (words.next(), words.next()) else {
        return !line.trim().is_empty();
    };
    let is_tracing = time.len() >= 20 && time.as_bytes()[4] == b'-' && time.ends_with('Z');
    if !is_tracing {
        return true;
    }
    matches!(level, "WARN" | "ERROR")
}

/// `step 120/690 (17%), epoch 3/30, loss 0.1234, 2.1k samples/s, ETA 12s`.
pub(crate) fn progress_text(p: &TrainingProgress) -> String {
    let mut text = format!(
        "step {}/{} ({}%), epoch {}/{}",
        p.step, p.total_steps, p.percent, p.epoch, p.epochs
    );
    if let Some(loss) = p.loss {
        text.push_str(&format!(", loss {loss:.4}"));
    }
    if let Some(rate) = p.samples_per_second {
        text.push_str(&format!(", {} samples/s", short_number(rate)));
    }
    if let Some(eta) = p.estimated_remaining_seconds {
        text.push_str(&format!(", ETA {}", duration_text(eta)));
    }
    text
}

/// Whether a plain progress line is due: the first, the last, every 10%, or [`PLAIN_INTERVAL`] after the last.
pub(crate) fn plain_line_due(
    last: Option<(Instant, u32)>,
    now: Instant,
    p: &TrainingProgress,
) -> bool {
    match last {
        None => true,
        Some((at, percent)) => {
            p.step >= p.total_steps
                || p.percent / 10 > percent / 10
                || now.saturating_duration_since(at) >= PLAIN_INTERVAL
        }
    }
}

fn short_number(n: f64) -> String {
    match n {
        n if n >= 1e6 => format!("{:.1}M", n / 1e6),
        n if n >= 1e3 => format!("{:.1}k", n / 1e3),
        n => format!("{n:.1}"),
    }
}

fn duration_text(seconds: u64) -> String {
    match seconds {
        s if s >= 3600 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        s if s >= 60 => format!("{}m{:02}s", s / 60, s % 60),
        s => format!("{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(step: u64, eta: Option<u64>) -> TrainingProgress {
        TrainingProgress {
            step,
            total_steps: 690,
            epoch: 3,
            epochs: 30,
            percent: (step * 100 / 690) as u32,
            estimated_remaining_seconds: eta,
            loss: Some(0.12345),
            samples_per_second: Some(2140.0),
            update_time: None,
        }
    }

    #[test]
    fn the_progress_line_reads_as_a_person_would_write_it() {
        assert_eq!(
            progress_text(&at(120, Some(75))),
            "step 120/690 (17%), epoch 3/30, loss 0.1235, 2.1k samples/s, ETA 1m15s"
        );
        let mut early = at(0, None);
        early.loss = None;
        early.samples_per_second = None;
        assert_eq!(progress_text(&early), "step 0/690 (0%), epoch 3/30");
    }

    #[test]
    fn plain_lines_come_every_ten_percent_every_five_seconds_and_at_the_end() {
        let t0 = Instant::now();
        assert!(plain_line_due(None, t0, &at(1, None)));
        let last = Some((t0, 17));
        assert!(!plain_line_due(
            last,
            t0 + Duration::from_secs(1),
            &at(125, None)
        ));
        assert!(
            plain_line_due(last, t0 + Duration::from_secs(1), &at(140, None)),
            "20%"
        );
        assert!(plain_line_due(last, t0 + PLAIN_INTERVAL, &at(125, None)));
        assert!(plain_line_due(last, t0, &at(690, None)), "the last step");
    }

    #[test]
    fn only_warnings_errors_and_foreign_lines_pass_without_verbose() {
        let info =
            "2026-11-24T19:35:28.324058Z  INFO worker{rank=2}: rdu_worker::train: epoch done";
        let warn = "2026-11-24T19:35:28.324058Z  WARN worker{rank=2}: rdu_worker::train: no held-out samples";
        let error =
            "2026-11-24T19:35:28.324058Z ERROR worker{rank=2}: rdu_worker::run: rank failed";
        assert!(!is_warning_or_error(info));
        assert!(is_warning_or_error(warn));
        assert!(is_warning_or_error(error));
        assert!(is_warning_or_error(
            "thread 'main' panicked at src/x.rs:1:1"
        ));
        assert!(!is_warning_or_error("   "));
    }
}
