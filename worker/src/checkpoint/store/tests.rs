//! The fence at work on a real directory: stale writers and starters refused, lineage choice, pruning, and a
//! writer racing a new generation's fence.

use std::sync::mpsc;
use std::time::Duration;

use super::*;
use crate::checkpoint::fence::FENCE_FILE;
use crate::checkpoint::format::tests::{encode_v1, sample};
use crate::checkpoint::format::{decode, file_name};

const WAIT: Duration = Duration::from_secs(10);

fn writer(uid: &str, generation: u64) -> Writer {
    Writer {
        job_uid: uid.into(),
        generation,
    }
}

fn start(dir: &Path, uid: &str, generation: u64, keep: usize) -> (CheckpointStore, Option<u64>) {
    let (store, found) =
        CheckpointStore::fence(dir, writer(uid, generation), keep, 3, WAIT).unwrap();
    (store, found.map(|c| c.step))
}

fn save(store: &CheckpointStore, step: u64) -> Result<PathBuf, CheckpointError> {
    store.save(&sample(step, "ignored: the store names the writer", 99).snapshot())
}

/// The checkpoint files of `dir` as (step, generation), ascending.
fn on_disk(dir: &Path) -> Vec<(u64, u64)> {
    let mut listed: Vec<_> = files::list(dir)
        .unwrap()
        .into_iter()
        .map(|l| (l.step, l.generation))
        .collect();
    listed.sort();
    listed
}

/// A checkpoint of generation 0 at `step`, put in place by hand as a writer that knows no fence would.
fn write_past_the_fence(dir: &Path, step: u64) {
    let stray = sample(step, "uid-a", 0);
    let bytes = format::encode(&stray.writer, &stray.snapshot());
    std::fs::write(dir.join(file_name(step, 0)), bytes).unwrap();
}

fn fence_of(dir: &Path) -> Fence {
    fence::read(dir).unwrap().expect("a fence")
}

#[test]
fn a_checkpoint_names_its_writer_and_a_restart_resumes_from_it() {
    let dir = tempfile::tempdir().unwrap();
    let (gen0, found) = start(dir.path(), "uid-a", 0, 2);
    assert_eq!(found, None);
    assert_eq!(
        fence_of(dir.path()),
        Fence {
            job_uid: "uid-a".into(),
            generation: 0,
            resumed_from: None
        }
    );
    let path = save(&gen0, 10).unwrap();
    assert_eq!(path.file_name().unwrap(), file_name(10, 0).as_str());
    let written = decode(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(written.writer, writer("uid-a", 0));
    let (_, found) = start(dir.path(), "uid-a", 1, 2);
    assert_eq!(found, Some(10));
    assert_eq!(fence_of(dir.path()).resumed_from, Some(file_name(10, 0)));
}

#[test]
fn a_stale_writer_is_refused_and_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let (gen0, _) = start(dir.path(), "uid-a", 0, 5);
    save(&gen0, 10).unwrap();
    let (gen1, found) = start(dir.path(), "uid-a", 1, 5);
    assert_eq!(found, Some(10));
    match save(&gen0, 20) {
        Err(
            e @ CheckpointError::Superseded {
                mine: 0, fence: 1, ..
            },
        ) => {
            assert_eq!(e.exit_code(), 75);
        }
        other => panic!("{other:?}"),
    }
    assert!(STALE_WRITES_REFUSED.load(Ordering::Relaxed) >= 1);
    save(&gen1, 30).unwrap();
    assert_eq!(on_disk(dir.path()), [(10, 0), (30, 1)]);
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(
        names.is_empty(),
        "the refused write's staged file is gone: {names:?}"
    );
}

#[test]
fn a_stale_starter_is_refused_and_the_fence_stays() {
    let dir = tempfile::tempdir().unwrap();
    let (gen2, _) = start(dir.path(), "uid-a", 2, 2);
    save(&gen2, 10).unwrap();
    match CheckpointStore::fence(dir.path(), writer("uid-a", 1), 2, 3, WAIT) {
        Err(
            e @ CheckpointError::Superseded {
                mine: 1, fence: 2, ..
            },
        ) => {
            assert_eq!(e.exit_code(), 75)
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(fence_of(dir.path()).generation, 2);
    // The same generation starting again (a restarted container) is not stale.
    let (_, found) = start(dir.path(), "uid-a", 2, 2);
    assert_eq!(found, Some(10));
}

#[test]
fn a_new_job_resumes_the_old_ones_lineage_and_the_old_one_can_no_longer_write() {
    let dir = tempfile::tempdir().unwrap();
    let (old, _) = start(dir.path(), "uid-old", 3, 2);
    save(&old, 40).unwrap();
    // A second `rdujob run --checkpoint-dir`, or a job made again under the same name: generation 0 of
    // another UID.
    let (new, found) = start(dir.path(), "uid-new", 0, 2);
    assert_eq!(found, Some(40));
    match save(&old, 50) {
        Err(e @ CheckpointError::TakenOver { generation: 0, .. }) => {
            assert_eq!(e.exit_code(), 64);
            assert!(e.to_string().contains("uid-new"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    save(&new, 60).unwrap();
    assert_eq!(on_disk(dir.path()), [(40, 3), (60, 0)]);
}

#[test]
fn a_newer_file_outside_the_lineage_is_never_resumed_from() {
    let dir = tempfile::tempdir().unwrap();
    let (gen0, _) = start(dir.path(), "uid-a", 0, 5);
    save(&gen0, 10).unwrap();
    let (_gen1, found) = start(dir.path(), "uid-a", 1, 5);
    assert_eq!(found, Some(10));
    // A file of generation 0 at a later step appears (written by a writer that knows no fence).
    write_past_the_fence(dir.path(), 99);
    // Generation 2: generation 1 wrote nothing, so what generation 1 resumed from.
    let (_, found) = start(dir.path(), "uid-a", 2, 5);
    assert_eq!(found, Some(10));
    assert_eq!(fence_of(dir.path()).resumed_from, Some(file_name(10, 0)));
}

#[test]
fn a_damaged_newest_checkpoint_falls_back_within_the_lineage() {
    let dir = tempfile::tempdir().unwrap();
    let (gen0, _) = start(dir.path(), "uid-a", 0, 5);
    save(&gen0, 10).unwrap();
    let (gen1, _) = start(dir.path(), "uid-a", 1, 5);
    save(&gen1, 20).unwrap();
    let newest = save(&gen1, 30).unwrap();
    let mut bytes = std::fs::read(&newest).unwrap();
    bytes[30] ^= 0xff;
    std::fs::write(&newest, &bytes).unwrap();
    let (_, found) = start(dir.path(), "uid-a", 2, 5);
    assert_eq!(found, Some(20));
    // What generation 2 resumed from damaged too: the lineage's older state, generation 0's step 10.
    std::fs::write(dir.path().join(file_name(20, 1)), b"garbage").unwrap();
    let (_, found) = start(dir.path(), "uid-a", 3, 5);
    assert_eq!(found, Some(10));
    // Nothing intact left in the lineage: step 0, never a stray file of a later step.
    std::fs::remove_file(dir.path().join(file_name(10, 0))).unwrap();
    write_past_the_fence(dir.path(), 99);
    let (_, found) = start(dir.path(), "uid-a", 4, 5);
    assert_eq!(found, None);
}

#[test]
fn a_directory_of_the_first_format_resumes_from_its_newest_file() {
    let dir = tempfile::tempdir().unwrap();
    for step in [10, 20] {
        std::fs::write(
            dir.path().join(format!("ckpt-{step:012}.bin")),
            encode_v1(&sample(step, "", 0)),
        )
        .unwrap();
    }
    let (gen0, found) = start(dir.path(), "uid-a", 0, 1);
    assert_eq!(found, Some(20));
    assert_eq!(
        fence_of(dir.path()).resumed_from.as_deref(),
        Some("ckpt-000000000020.bin")
    );
    // Its own first checkpoint supersedes the old files (keep 1).
    save(&gen0, 30).unwrap();
    assert_eq!(on_disk(dir.path()), [(30, 0)]);
}

#[test]
fn pruning_keeps_the_newest_of_the_lineage_only() {
    let dir = tempfile::tempdir().unwrap();
    let (gen0, _) = start(dir.path(), "uid-a", 0, 2);
    for step in [10, 20, 30] {
        save(&gen0, step).unwrap();
    }
    assert_eq!(on_disk(dir.path()), [(20, 0), (30, 0)]);
    let (gen1, found) = start(dir.path(), "uid-a", 1, 2);
    assert_eq!(found, Some(30));
    // A later file of generation 0 that generation 1 did not resume from: outside its lineage.
    write_past_the_fence(dir.path(), 35);
    save(&gen1, 40).unwrap();
    assert_eq!(on_disk(dir.path()), [(30, 0), (35, 0), (40, 1)]);
    save(&gen1, 50).unwrap();
    assert_eq!(on_disk(dir.path()), [(35, 0), (40, 1), (50, 1)]);
}

#[test]
fn a_damaged_fence_stops_starts_and_writes() {
    let dir = tempfile::tempdir().unwrap();
    let (gen0, _) = start(dir.path(), "uid-a", 0, 2);
    std::fs::write(dir.path().join(FENCE_FILE), "{\"generation\": \"x\"}").unwrap();
    for result in [
        save(&gen0, 10).map(|_| ()),
        CheckpointStore::fence(dir.path(), writer("uid-a", 1), 2, 3, WAIT).map(|_| ()),
    ] {
        match result {
            Err(e @ CheckpointError::BadFence { .. }) => {
                assert_eq!(e.exit_code(), 74);
                assert!(e.to_string().contains("delete it"), "{e}");
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(on_disk(dir.path()).is_empty());
}

#[test]
fn a_symlinked_fence_is_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let target = elsewhere.path().join("fence");
    std::fs::write(
        &target,
        "{\"jobUid\":\"uid-a\",\"generation\":0,\"resumedFrom\":null}",
    )
    .unwrap();
    std::os::unix::fs::symlink(&target, dir.path().join(FENCE_FILE)).unwrap();
    assert!(matches!(
        CheckpointStore::fence(dir.path(), writer("uid-a", 1), 2, 3, WAIT),
        Err(CheckpointError::Io { .. })
    ));
}

#[test]
fn a_write_holding_the_lock_lands_before_the_fence_and_is_then_a_candidate() {
    let dir = tempfile::tempdir().unwrap();
    let (gen0, _) = start(dir.path(), "uid-a", 0, 5);
    save(&gen0, 10).unwrap();
    let (holding_tx, holding_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let path = dir.path().to_path_buf();
    std::thread::scope(|s| {
        // Owned here: should an assertion below fail, the writer's wait ends instead of hanging the test.
        let go_tx = go_tx;
        let gen0 = &gen0;
        let writing = s.spawn(move || {
            gen0.save_checked(&sample(20, "", 0).snapshot(), || {
                holding_tx.send(()).unwrap();
                go_rx.recv().unwrap();
            })
        });
        holding_rx.recv().unwrap();
        // The writer passed the fence check and holds the shared lock: no generation can fence now.
        assert!(matches!(
            files::lock(&path, LockKind::Exclusive, Duration::ZERO),
            Err(CheckpointError::LockTimeout { .. })
        ));
        let fencing = s.spawn(|| CheckpointStore::fence(&path, writer("uid-a", 1), 5, 3, WAIT));
        go_tx.send(()).unwrap();
        writing.join().unwrap().unwrap();
        let (_, found) = fencing.join().unwrap().unwrap();
        assert_eq!(
            found.map(|c| c.step),
            Some(20),
            "the landed write is the lineage's newest"
        );
    });
}

#[test]
fn a_writer_racing_a_new_generation_is_accepted_before_the_fence_or_refused_never_after() {
    for round in 0..10u64 {
        let dir = tempfile::tempdir().unwrap();
        let (gen0, _) = start(dir.path(), "uid-a", 0, 1000);
        let (saved_tx, saved_rx) = mpsc::channel();
        let (accepted, chosen) = std::thread::scope(|s| {
            let writing = s.spawn(|| {
                let mut accepted = Vec::new();
                for step in 1.. {
                    match save(&gen0, step) {
                        Ok(_) => accepted.push(step),
                        Err(CheckpointError::Superseded { .. }) => break,
                        Err(e) => panic!("{e}"),
                    }
                    let _ = saved_tx.send(step);
                }
                accepted
            });
            // Fence after a few saves, a different number each round.
            for _ in 0..=round {
                saved_rx.recv().unwrap();
            }
            let (_, found) =
                CheckpointStore::fence(dir.path(), writer("uid-a", 1), 1000, 3, WAIT).unwrap();
            (writing.join().unwrap(), found.map(|c| c.step))
        });
        let last = *accepted.last().expect("saves before the fence");
        assert_eq!(
            chosen,
            Some(last),
            "round {round}: generation 1 resumes from the last accepted write"
        );
        assert_eq!(accepted, (1..=last).collect::<Vec<_>>());
        let newest_on_disk = on_disk(dir.path()).last().copied();
        assert_eq!(
            newest_on_disk,
            Some((last, 0)),
            "round {round}: nothing landed after the fence"
        );
    }
}
