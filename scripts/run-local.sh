#!/usr/bin/env bash
# Set up (if needed) and run one agent on a real vLLM CPU engine, serving a tiny model
# generated on the spot. Ctrl-C stops it and its engine processes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} TOKENIZERS_PARALLELISM=false
if [ ! -f .local-fleet/models/base/config.json ]; then
  .venv/bin/python -m agents.tiny_model .local-fleet/models
fi
export RLAGENT_ADMIN__TOKEN=${RLAGENT_ADMIN__TOKEN:-$(.venv/bin/python -c 'import secrets; print(secrets.token_urlsafe(16))')}
root=$(pwd)/.local-fleet/models
export RLAGENT_ENGINE__MODEL="$root/base" RLAGENT_ALLOWED_ROOTS="[\"$root\"]"
cat <<MSG
Starting an agent (engine start-up takes ~30 s). Admin token: $RLAGENT_ADMIN__TOKEN
Then, from another terminal:
  curl -s localhost:8101/v1/agent/state
  curl -s localhost:8100/v1/completions -H 'Content-Type: application/json' \\
       -d '{"model": "tiny", "prompt": "The quick brown fox", "max_tokens": 16}'
  curl -s -X POST 'localhost:8101/pause?mode=keep' -H "Authorization: Bearer $RLAGENT_ADMIN__TOKEN"
  curl -s -X POST localhost:8101/v1/agent/weights/disk -H "Authorization: Bearer $RLAGENT_ADMIN__TOKEN" \\
       -H 'Content-Type: application/json' -d '{"path": "$root/weights-2", "version": "v2"}'
  curl -s -X POST localhost:8101/resume -H "Authorization: Bearer $RLAGENT_ADMIN__TOKEN"
MSG
exec .venv/bin/python -m agents --config configs/agent-local.yaml
