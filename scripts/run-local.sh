#!/usr/bin/env bash
# Set up (if needed) and run the whole system locally: N agents, the controller and a small
# trainer loop pushing a weight version per step (python -m rlcp.localfleet).
#   bash scripts/run-local.sh                 # real vLLM CPU engines on a tiny model made on the spot
#   bash scripts/run-local.sh --sim           # simulated engines, seconds
#   bash scripts/run-local.sh --sim --envoy   # rollouts through a real Envoy fed the fence over xDS
#   bash scripts/run-local.sh --keep-running  # keep the fleet up after the steps; Ctrl-C stops it all
#   bash scripts/run-local.sh --serve-only --lora  # a fleet for your own trainer (TRL): no trainer of ours;
#                                             # prints the one URL to point it at (--steps 0 does the same)
#   bash scripts/run-local.sh --trainer trl   # TRL's own AsyncGRPOTrainer, a LoRA policy, through the one URL
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m rlcp.localfleet "$@"
