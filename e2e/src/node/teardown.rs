//! Removing what a test node leaves on the machine once its processes are gone: containerd shims still
//! running, mounts below the node's directory (container root filesystems, network namespaces, volumes)
//! and the kubelet's `/var/log/containers` links into it.

use std::path::Path;
use std::process::Command;

/// Kills every process whose command line mentions `needle` (e.g. containerd shims started with the
/// node's containerd socket as `-address`), except this process.
pub fn kill_processes_mentioning(needle: &str) {
    let me = std::process::id().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in entries.flatten() {
        let pid = entry.file_name().to_string_lossy().into_owned();
        if pid == me || !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if String::from_utf8_lossy(&cmdline).contains(needle) {
            let _ = Command::new("kill").args(["-9", &pid]).output();
        }
    }
}

/// The mount points below `dir` in `mountinfo` text, deepest first.
pub fn mounts_below(mountinfo: &str, dir: &Path) -> Vec<String> {
    let prefix = dir.display().to_string();
    let mut points: Vec<String> = mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(unescape)
        .filter(|p| p == &prefix || p.starts_with(&format!("{prefix}/")))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    points.dedup();
    points
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4].iter().all(u8::is_ascii_digit)
        {
            let octal = std::str::from_utf8(&bytes[i + 1..i + 4]).unwrap_or("0");
            out.push(u8::from_str_radix(octal, 8).unwrap_or(b'?'));
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Unmounts (lazily) everything mounted below `dir`, deepest first.
pub fn unmount_below(dir: &Path) {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    for point in mounts_below(&info, dir) {
        let _ = Command::new("umount").args(["-l", &point]).output();
    }
}

/// Removes the `/var/log/containers` links that point below `dir`.
pub fn remove_log_links(dir: &Path) {
    let Ok(entries) = std::fs::read_dir("/var/log/containers") else {
        return;
    };
    for entry in entries.flatten() {
        if std::fs::read_link(entry.path()).is_ok_and(|target| target.starts_with(dir)) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mounts_below_a_directory_are_found_deepest_first() {
        let info = "22 1 0:21 / /proc rw - proc proc rw\n\
                    30 22 0:40 / /tmp/n/state/netns/cni-1 rw - nsfs nsfs rw\n\
                    31 22 0:41 / /tmp/n/root/a\\040b/rootfs rw - overlay overlay rw\n\
                    32 22 0:42 / /tmp/nx rw - tmpfs tmpfs rw\n";
        assert_eq!(
            mounts_below(info, Path::new("/tmp/n")),
            vec![
                "/tmp/n/state/netns/cni-1".to_string(),
                "/tmp/n/root/a b/rootfs".to_string()
            ]
        );
    }
}
