# Sourced by e2e/kind/run.sh and e2e/kind/testbed.sh (not run): warns when the host's inotify limits are below what
# kind's known issues ask for. Each kind node runs systemd, containerd and the kubelet, and each takes inotify
# instances of the host user's quota; with the kernel's default of 128 a second cluster (or a busy one) ran out
# here: a rebooted node's systemd exited at once ("Failed to allocate manager object: Too many open files") and
# Kueue's manager could not start. CI raises them (.ci/run); on your machine:
#   sudo sysctl fs.inotify.max_user_instances=512 fs.inotify.max_user_watches=524288
inotify_check() {
  local key want have
  for key in max_user_instances=512 max_user_watches=524288; do
    want="${key#*=}" key="${key%%=*}"
    have="$(cat "/proc/sys/fs/inotify/$key" 2>/dev/null || echo "$want")"
    if ((have < want)); then
      echo "warning: fs.inotify.$key is $have; kind's nodes may fail with 'too many open files' (kind's known" \
        "issues: sudo sysctl fs.inotify.$key=$want)" >&2
    fi
  done
}
inotify_check
