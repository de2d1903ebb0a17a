#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite, real-vLLM tests included.
# Arguments go to pytest as they are: the fast lane (no real vLLM engine, no image build) is
#   bash scripts/test.sh -m "not vllm and not images"
# and one folder or file runs alone the same way (bash scripts/test.sh tests/controller).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
