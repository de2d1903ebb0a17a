#!/usr/bin/env bash
# Installs Dynamo 1.6.1's own released wheels for the real-software tests only.
# Dynamo's wheels pin versions that clash with ours, so they go --no-deps into a
# separate target dir that only the Dynamo processes put on PYTHONPATH; the
# product's runtime dependencies do not change. Idempotent: a stamp file marks a
# finished install (keyed by this script, so a changed pin reinstalls), and downloaded wheels are
# cached outside the repo. Every wheel is pinned and installed by name: the cache outlives runs and
# may hold other versions (an unpinned download once brought msgspec 0.23.0 beside 0.22.0, and
# installing the cache's *.whl then asked pip for both).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
py="${here}/.venv/bin/python"
version="1.6.1"
cache="${RLCP_DYNAMO_CACHE:-/var/cache/rlcp-dynamo}"
target="${RLCP_DYNAMO_TARGET:-${here}/.venv/dynamo-${version}}"
stamp="${target}/.rlcp-installed-${version}-$(sha256sum "$0" | cut -c1-16)"
# Dynamo's runtime needs beyond the project venv, at the versions its tests ran with.
extras=("redis==8.1.0" "msgspec==0.22.0" "zstandard==0.25.0" "blake3==1.0.11")

if [[ -f "${stamp}" ]]; then
  echo "${target}"
  exit 0
fi
fail() { echo "setup-dynamo.sh: FAILED: $*" >&2; exit 1; }
[[ -x "${py}" ]] || fail "no venv at ${here}/.venv (run scripts/bootstrap.sh first)"
mkdir -p "${cache}" "$(dirname "${target}")" || fail "cannot create wheel cache ${cache}"
# Two test processes may ask at once (the engine part's Dynamo tests, the rest's check of this
# script): one installs, the other waits and finds the stamp. The cache has a lock of its own,
# since several targets share it.
exec 9>"${target}.lock"
flock -w 900 9 || fail "another install of ${target} holds ${target}.lock"
exec 8>"${cache}/.lock"
flock -w 900 8 || fail "another install holds ${cache}/.lock"
if [[ -f "${stamp}" ]]; then echo "${target}"; exit 0; fi
if ! ls "${cache}"/ai_dynamo-${version}-*.whl >/dev/null 2>&1 \
   || ! ls "${cache}"/ai_dynamo_runtime-${version}-*.whl >/dev/null 2>&1; then
  "${py}" -m pip download -q --no-deps -d "${cache}" \
    "ai-dynamo==${version}" "ai-dynamo-runtime==${version}" \
    || fail "pip download of ai-dynamo==${version} / ai-dynamo-runtime==${version} (network to PyPI?)"
fi
pinned=("ai-dynamo==${version}" "ai-dynamo-runtime==${version}" "${extras[@]}")
if ! "${py}" -m pip download -q --no-deps --no-index --find-links "${cache}" --find-links "${cache}/extras" \
     -d "${cache}/extras" "${extras[@]}" >/dev/null 2>&1; then
  "${py}" -m pip download -q --no-deps -d "${cache}/extras" "${extras[@]}" \
    || fail "pip download of ${extras[*]}"
fi
rm -rf "${target}"
"${py}" -m pip install -q --no-deps --no-index --find-links "${cache}" --find-links "${cache}/extras" \
  --target "${target}" "${pinned[@]}" \
  || fail "pip install --target ${target} ${pinned[*]}"
touch "${stamp}"
echo "${target}"
