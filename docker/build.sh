#!/usr/bin/env bash
# Builds the three images from docker/Dockerfile, compiled once (the build stage is shared by the targets):
#   bash docker/build.sh            # rdu-operator, rdu-device-plugin and rdu-worker, tagged $TAG (0.1.0)
# Uses docker when it answers, else podman (CONTAINER_ENGINE=podman picks it). Extra arguments go to every
# build (for example --pull=never where the base images are local). RDU_BINARIES_OUT=DIR also copies the
# release binaries into DIR (the target `binaries`; with docker that needs BuildKit).
set -euo pipefail
cd "$(dirname "$0")/.."
TAG="${TAG:-0.1.0}"
ENGINE="${CONTAINER_ENGINE:-}"
if [[ -z "$ENGINE" ]]; then
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then ENGINE=docker
  elif command -v podman >/dev/null; then ENGINE=podman
  else echo "docker/build.sh: neither docker nor podman is usable; install one" >&2; exit 1
  fi
fi
for target in operator device-plugin worker; do
  printf '+ %s build -f docker/Dockerfile --target %s -t rdu-%s:%s %s .\n' "$ENGINE" "$target" "$target" "$TAG" "$*" >&2
  "$ENGINE" build -f docker/Dockerfile --target "$target" -t "rdu-$target:$TAG" "$@" .
done
if [[ -n "${RDU_BINARIES_OUT:-}" ]]; then
  printf '+ %s build -f docker/Dockerfile --target binaries --output type=local,dest=%s %s .\n' "$ENGINE" "$RDU_BINARIES_OUT" "$*" >&2
  "$ENGINE" build -f docker/Dockerfile --target binaries --output "type=local,dest=$RDU_BINARIES_OUT" "$@" .
fi
