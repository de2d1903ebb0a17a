"""What the local fleet tells the user: progress as it happens (`say`), the workers' state, and
the banner naming the one URL to point a trainer at and how to drive the fleet by hand."""

from __future__ import annotations

import argparse
import functools
from typing import Any

YES_NO = {True: "yes", False: "no", None: "?"}
say = functools.partial(print, flush=True)  # flushed: a pipe or a test sees progress as it happens


def print_workers(state: dict[str, Any]) -> None:
    for w in state["workers"]:
        say(
            f"    {w['id']:<10} version={w['weight_version']}  ready={YES_NO[w['ready']]}  paused={YES_NO[w['paused']]}"
            + (f"  ({w['not_ready_reason']})" if w.get("not_ready_reason") else "")
        )


def banner(args: argparse.Namespace, *, url: str, gateway: str, token: str, model: str, what: str) -> str:
    """What the user is told once the fleet is up: the one URL to point a trainer at (the
    gateway's; every admin route of the controller's is meant to answer there too), the
    controller's, and how to drive both by hand."""
    auth = f'-H "Authorization: Bearer {token}" -H "Content-Type: application/json"'
    lora = (
        f"on (max_loras={args.lora.max_loras}, max_lora_rank={args.lora.max_lora_rank}; TRL's adapter sync needs "
        "max_loras >= max_staleness + 2)"
        if args.lora
        else "off (--lora turns it on)"
    )
    after = (
        "no trainer of ours runs (--serve-only): the fleet stays up until Ctrl-C"
        if args.serve_only
        else "--keep-running keeps it up after the steps"
    )
    return f"""
The fleet's URL (point a trainer here, e.g. TRL's vllm_server_base_url): {gateway}
  ({what})
Controller: {url}   API token: {token}
LoRA: {lora}
From another terminal, while it runs ({after}):
  export RLCTL_URL={url} RLCTL_TOKEN={token}
  .venv/bin/rlctl state --watch
  .venv/bin/rlctl pause --mode keep && .venv/bin/rlctl resume
  curl -s {url}/v1/rl/state | python3 -m json.tool
  curl -s -X POST {url}/v1/rl/pause {auth} -d '{{"mode": "keep"}}'
  curl -s -X POST {url}/v1/rl/resume {auth} -d '{{}}'
  curl -si {gateway}/v1/completions -H 'Content-Type: application/json' \\
       -d '{{"model": "{model}", "prompt": "The quick brown fox", "max_tokens": 16}}'
"""
