#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite, real-vLLM tests included.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
