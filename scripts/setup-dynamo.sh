#!/usr/bin/env bash
# Installs Dynamo 1.6.1's own released wheels for the real-software tests only.
# Dynamo's wheels pin versions that clash with ours, so they go --no-deps into a
# separate target dir that only the Dynamo processes put on PYTHONPATH; the
# product's runtime dependencies do not change. Idempotent: a stamp file marks a
# finished install, and downloaded wheels are cached outside the repo.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
py="${here}/.venv/bin/python"
version="1.6.1"
cache="${RLCP_DYNAMO_CACHE:-/var/cache/rlcp-dynamo}"
target="${RLCP_DYNAMO_TARGET:-${here}/.venv/dynamo-${version}}"
stamp="${target}/.rlcp-installed-${version}"
extras=(redis msgspec zstandard blake3)

if [[ -f "${stamp}" ]]; then
  echo "${target}"
  exit 0
fi
fail() { echo "setup-dynamo.sh: FAILED: $*" >&2; exit 1; }
[[ -x "${py}" ]] || fail "no venv at ${here}/.venv (run scripts/bootstrap.sh first)"
mkdir -p "${cache}" || fail "cannot create wheel cache ${cache}"
if ! ls "${cache}"/ai_dynamo-${version}-*.whl >/dev/null 2>&1 \
   || ! ls "${cache}"/ai_dynamo_runtime-${version}-*.whl >/dev/null 2>&1; then
  "${py}" -m pip download -q --no-deps -d "${cache}" \
    "ai-dynamo==${version}" "ai-dynamo-runtime==${version}" \
    || fail "pip download of ai-dynamo==${version} / ai-dynamo-runtime==${version} (network to PyPI?)"
fi
"${py}" -m pip download -q --no-deps -d "${cache}/extras" "${extras[@]}" \
  || fail "pip download of ${extras[*]}"
rm -rf "${target}"
"${py}" -m pip install -q --no-deps --no-index --target "${target}" \
  "${cache}"/ai_dynamo-${version}-*.whl "${cache}"/ai_dynamo_runtime-${version}-*.whl \
  "${cache}"/extras/*.whl \
  || fail "pip install --target ${target}"
touch "${stamp}"
echo "${target}"
