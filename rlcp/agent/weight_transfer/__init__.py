"""Weight-transfer backends this project adds to vLLM's weight-transfer protocol.

Each backend module registers itself with vLLM's factories from a `vllm.general_plugins`
entry point (see pyproject.toml), so the engine's worker processes find it by name: `cpu_gloo`,
whose bytes move through `gloo_wire`.
"""
