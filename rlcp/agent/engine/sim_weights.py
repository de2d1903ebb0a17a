"""What `SimEngine` holds on its (simulated) device: base weights as a key, their version,
the LoRA adapters loaded on them, and which allocations sleep mode has released.

Tokens and checksums derive from these, so a weight change shows in both. A base-weight
change drops every held adapter (vLLM's `reset_lora_state`). Sleep level 2 loses the
weights, as it does on a GPU: the engine wakes with garbage until they are reloaded.
"""

from __future__ import annotations

from rlcp.agent.engine.sim_digest import digest
from rlcp.agent.engine.sim_lora import LoraTable
from rlcp.agent.engine.sim_scheduler import SimRequest

SLEEP_TAGS = frozenset({"weights", "kv_cache"})
_PARAM_NAMES = ("model.embed_tokens.weight", "model.layers.0.mlp.weight", "lm_head.weight")


class SimWeights:
    def __init__(self, model_name: str, version: str | None) -> None:
        self.key = digest("initial", model_name)
        self.version = version
        self.loras = LoraTable()
        self.asleep: set[str] = set()  # the allocations asleep (`SLEEP_TAGS`)

    def replace(self, key: bytes) -> None:
        self.key = key
        self.loras.drop_held()  # vLLM's reset_lora_state after replacing base weights

    def emit(self, req: SimRequest) -> None:
        """Append `req`'s next token: a hash of the weights, its adapter, prompt and tokens so far."""
        # Adapters are looked up per step: a hot-swap shows in running requests, and one
        # dropped by a weight reload is loaded again from its path, as vLLM's LRU manager does.
        lora_key = b"" if req.lora is None else self.loras.token_key(req.lora)
        token = int.from_bytes(digest(self.key, lora_key, req.prompt_key, req.chain)[:8], "little") % 1000
        req.chain = digest(req.chain, token.to_bytes(2, "little"))
        req.token_ids.append(token)
        req.versions.append(self.version)

    def checksums(self) -> dict[str, str]:
        return {name: digest(self.key, name).hex() for name in _PARAM_NAMES} | self.loras.checksums()

    def sleep(self, level: int) -> None:
        if level >= 1 and not self.asleep:
            self.asleep = set(SLEEP_TAGS)
            if level == 2:
                self.replace(digest("discarded", self.key))  # garbage until reloaded

    def wake(self, tags: list[str] | None) -> bool:
        """Wake `tags` (all if None or empty); whether the engine is fully awake."""
        self.asleep -= set(tags) if tags else SLEEP_TAGS
        return not self.asleep
