# Sourced by e2e/node/run.sh and e2e/multi-node/run.sh (not run): what the Rust testbed (e2e/src/testbed.rs, a
# kind cluster per test) needs. Picks the container engine as e2e/kind/run.sh does, checks the tools, builds the
# three images from docker/Dockerfile (a cache hit when nothing changed) and the CLIs the tests run.
#   RDU_KIND_NODE_IMAGE   the node image (kind's default otherwise; CI's offline one: e2e/kind/offline/prepare.sh)
#   RDU_KIND_BUILD_ARGS   extra image build arguments (CI: --pull=never)
#   RDU_E2E_HELM          helm (else helm on PATH)
#   RDU_E2E_IMAGES_READY_FILE  with RDU_E2E_PREBUILT=1: a file made once the images are built; the cluster comes
#                         up at once and loads them when it is there (CI builds them beside the three-node cluster)

testbed_fail() { echo "${0}: $*" >&2; exit 1; }

if [[ -z "${KIND_EXPERIMENTAL_PROVIDER:-}" ]]; then
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
    export KIND_EXPERIMENTAL_PROVIDER=docker
  else
    export KIND_EXPERIMENTAL_PROVIDER=podman
  fi
fi
TESTBED_ENGINE="$KIND_EXPERIMENTAL_PROVIDER"
testbed_missing=()
for tool in kind kubectl "$TESTBED_ENGINE" cargo; do command -v "$tool" >/dev/null || testbed_missing+=("$tool"); done
if [[ -z "${RDU_E2E_HELM:-}" ]]; then
  command -v helm >/dev/null || testbed_missing+=(helm)
fi
((${#testbed_missing[@]} == 0)) || testbed_fail "missing ${testbed_missing[*]} (kind >= 0.23, kubectl, helm, and docker or podman)"
source e2e/kind/inotify.sh

# RDU_E2E_PREBUILT=1: the images and the workspace's binaries are built already (.ci/run builds them once, before
# the stages it runs side by side, whose builds would otherwise race on the same image tags).
if [[ "${RDU_E2E_PREBUILT:-}" != 1 ]]; then
  read -r -a testbed_build_args <<<"${RDU_KIND_BUILD_ARGS:-}"
  CONTAINER_ENGINE="$TESTBED_ENGINE" bash docker/build.sh "${testbed_build_args[@]}" >&2
  # `kubectl rdujob` and `rdujob` of this checkout, beside the test binaries.
  cargo build --workspace --bins >&2
fi

# testbed_run_ignored TEST: runs the #[ignore]d tests of e2e's test binary TEST one at a time, as `cargo test
# --workspace --test TEST -- --ignored --nocapture --test-threads=1` does, but runs the binary itself once cargo has
# built it: cargo holds the target directory's lock while the tests run, so two stages side by side (.ci/run) would
# otherwise run one after the other. Its output goes to stderr; the binary runs in e2e/, as cargo runs it.
testbed_run_ignored() {
  local test="$1" exe
  exe="$(cargo test --workspace --test "$test" --no-run --message-format=json-render-diagnostics | python3 -c '
import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    target = msg.get("target") or {}
    if msg.get("reason") == "compiler-artifact" and target.get("name") == sys.argv[1] \
            and "test" in target.get("kind", []) and msg.get("executable"):
        print(msg["executable"])
' "$test")"
  [[ -n "$exe" && -x "$exe" ]] || testbed_fail "cargo built no test binary called $test"
  (cd e2e && "$exe" --ignored --nocapture --test-threads=1) >&2
}
