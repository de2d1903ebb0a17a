"""The fleet's `GET /server_info`: the members' common resolved configuration, in vLLM's shape
(`rlcp/core/wire/server_info.py`), with what differs between them said plainly.

Every reachable member that reports its configuration (`ServerConfig`: the agent, a stock
`vllm serve` in dev mode) is asked for vLLM's `/server_info?config_format=json` `vllm_config`;
a member's answer is kept while the same instance runs (a configuration changes only with a
restart), so a trainer polling the route costs one read per member and restart.

The merge (`merge_configs`), key by key through the JSON trees:
- a value every member has alike is the fleet's;
- where members differ, the fleet's value is null, except the capacities every member must
  have (`CAPACITIES`: `lora_config.max_loras`, `max_lora_rank`, `model_config.max_model_len`,
  ...), which take the smallest, what the whole fleet can do; either way the key is listed in
  `fleet.differing` with each member's own value (a key a member lacks: that member left out);
- `parallel_config.data_parallel_size` is not the members' sum: vLLM reports it so a client
  knows an adapter load (`/v1/load_lora_adapter`) reaches only the one data-parallel replica
  that took the request, and TRL refuses adapter-only sync above 1. The fleet's load reaches
  every member, so the fleet reports the largest of its members' own (1 when none runs data
  parallel itself: a load through the fleet then reaches every engine); `fleet.data_parallel`
  says why.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from rlcp.controlplane.fleet.members import WorkerRecord
from rlcp.controlplane.workers.capabilities import SERVER_CONFIG, implements
from rlcp.controlplane.workers.transport import WorkerCallError

log = structlog.get_logger("rlcp.controlplane.fleet.server_config")
READ_TIMEOUT_S = 5.0  # one member's /server_info; an unreachable one is named, the rest still answer
DATA_PARALLEL = "parallel_config.data_parallel_size"
# Where members differ, the fleet can do what its smallest member can.
CAPACITIES = frozenset(
    {
        "lora_config.max_loras",
        "lora_config.max_lora_rank",
        "lora_config.max_cpu_loras",
        "model_config.max_model_len",
        "scheduler_config.max_num_seqs",
        "scheduler_config.max_num_batched_tokens",
    }
)
WHY_DATA_PARALLEL = (
    "an adapter load or weight update through the fleet reaches every member, not one replica: the fleet "
    "reports the largest data_parallel_size among its members' own (1 when none runs data parallel itself), "
    "not their sum"
)
_ABSENT = object()


@dataclass
class FleetConfig:
    common: dict[str, Any]
    differing: dict[str, dict[str, Any]] = field(default_factory=dict)  # path -> worker id -> its value


def _same(values: list[Any]) -> bool:
    first = json.dumps(values[0], sort_keys=True, default=str)
    return all(json.dumps(v, sort_keys=True, default=str) == first for v in values[1:])


def _merge(values: dict[str, Any], path: str, differing: dict[str, dict[str, Any]]) -> Any:
    present = {w: v for w, v in values.items() if v is not _ABSENT}
    if len(present) == len(values) and _same(list(present.values())):
        return copy.deepcopy(next(iter(present.values())))
    if len(present) == len(values) and all(isinstance(v, dict) for v in present.values()):
        keys = list(dict.fromkeys(k for v in present.values() for k in v))
        return {
            k: _merge({w: v.get(k, _ABSENT) for w, v in present.items()}, f"{path}.{k}" if path else k, differing)
            for k in keys
        }
    differing[path] = copy.deepcopy(present)
    ints = [v for v in present.values() if isinstance(v, int) and not isinstance(v, bool)]
    if path in CAPACITIES and len(ints) == len(values):
        return min(ints)
    return None


def merge_configs(configs: Mapping[str, Mapping[str, Any]]) -> FleetConfig:
    """The members' common configuration (`configs`: worker id -> its `vllm_config` JSON tree)."""
    differing: dict[str, dict[str, Any]] = {}
    common = _merge({w: dict(c) for w, c in sorted(configs.items())}, "", differing) if configs else {}
    sizes = [_dp(c) for c in configs.values()]
    if not isinstance(common.get("parallel_config"), dict):
        common["parallel_config"] = {}
    common["parallel_config"]["data_parallel_size"] = max(sizes, default=1)
    return FleetConfig(common=common, differing=differing)


def _dp(config: Mapping[str, Any]) -> int:
    parallel = config.get("parallel_config")
    size = parallel.get("data_parallel_size") if isinstance(parallel, Mapping) else None
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else 1


class ServerConfigs:
    """Each member's configuration, read once per running instance."""

    def __init__(self, *, read_timeout_s: float = READ_TIMEOUT_S) -> None:
        self._read_timeout_s = read_timeout_s
        self._kept: dict[str, tuple[str | None, dict[str, Any]]] = {}  # worker id -> (instance id, config)

    async def read(self, records: list[WorkerRecord]) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
        """(worker id -> config, worker id -> why it could not be read), over `records`."""
        unread: dict[str, str] = {}
        asked: list[WorkerRecord] = []
        for r in records:
            if not implements(r.driver, SERVER_CONFIG):
                unread[r.id] = f"flavor {r.spec.flavor} reports no configuration"
            elif not r.reachable:
                unread[r.id] = "unreachable"
            else:
                asked.append(r)
        answers = await asyncio.gather(*(self._one(r) for r in asked))
        configs: dict[str, dict[str, Any]] = {}
        for r, answer in zip(asked, answers, strict=True):
            if isinstance(answer, str):
                unread[r.id] = answer
            else:
                configs[r.id] = answer
        for gone in set(self._kept) - {r.id for r in records}:
            del self._kept[gone]
        return configs, unread

    async def _one(self, record: WorkerRecord) -> dict[str, Any] | str:
        instance = record.status.instance_id if record.status else None
        kept = self._kept.get(record.id)
        if kept is not None and instance is not None and kept[0] == instance:
            return kept[1]
        driver = record.driver
        assert implements(driver, SERVER_CONFIG)
        try:
            async with asyncio.timeout(self._read_timeout_s):
                config = await driver.server_config()
        except TimeoutError:
            return f"no answer from GET /server_info in {self._read_timeout_s:g}s"
        except WorkerCallError as exc:
            log.info("server_info_unread", worker_id=record.id, error=str(exc))
            return f"GET /server_info failed: {exc}"
        self._kept[record.id] = (instance, config)
        return config
