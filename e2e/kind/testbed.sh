# Sourced by e2e/node/run.sh and e2e/multi-node/run.sh (not run): what the Rust testbed (e2e/src/testbed.rs, a
# kind cluster per test) needs. Picks the container engine as e2e/kind/run.sh does, checks the tools, builds the
# three images from docker/Dockerfile (a cache hit when nothing changed) and the CLIs the tests run.
#   RDU_KIND_NODE_IMAGE   the node image (kind's default otherwise; CI's offline one: e2e/kind/offline/prepare.sh)
#   RDU_KIND_BUILD_ARGS   extra image build arguments (CI: --pull=never)
#   RDU_E2E_HELM          helm (else helm on PATH)

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

read -r -a testbed_build_args <<<"${RDU_KIND_BUILD_ARGS:-}"
CONTAINER_ENGINE="$TESTBED_ENGINE" bash docker/build.sh "${testbed_build_args[@]}" >&2
# `kubectl rdujob` and `rdujob` of this checkout, beside the test binaries.
cargo build --workspace --bins >&2
