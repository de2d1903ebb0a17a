"""`SimEngine`'s weight-transfer session: vLLM's init / start / update / finish protocol.

It records what a trainer sent (each chunk, the tensor names) and hands the chunks over at
finish; the engine derives its new weights from them. A failed chunk ends the session, as
vLLM's worker does, so the trainer must `start_weight_update` again.
"""

from __future__ import annotations

import json

from rlcp.agent.engine.base import EngineError, TransferInfo


class TransferSession:
    def __init__(self) -> None:
        self.init_info: TransferInfo | None = None
        self._chunks: list[str] | None = None  # not None while an update is active
        self.chunk_count = 0  # these two are for tests to observe
        self.updated_names: list[str] = []

    def init(self, init_info: TransferInfo) -> None:
        self.init_info = dict(init_info)

    def shutdown(self) -> None:
        self.init_info = None

    def start(self) -> None:
        if self.init_info is None:
            raise EngineError("weight transfer is not initialised; call init_weight_transfer first")
        if self._chunks is not None:
            raise EngineError("a weight update is already active; call finish_weight_update first")
        self._chunks, self.updated_names = [], []

    def end(self) -> None:
        """The update fails: vLLM's worker ends the session when a chunk fails."""
        self._chunks = None

    def update(self, update_info: TransferInfo | list[TransferInfo]) -> None:
        if self._chunks is None:
            raise EngineError("start_weight_update must be called before update_weights")
        names = [info.get("names", []) for info in (update_info if isinstance(update_info, list) else [update_info])]
        if not all(isinstance(n, list) for n in names):
            # vLLM fails such a chunk in its backend, and its worker ends the session with it.
            self.end()
            raise EngineError(f"update_info.names must be a list of tensor names, got {names!r:.200}")
        self._chunks.append(json.dumps(update_info, sort_keys=True, default=repr))
        self.updated_names.extend(str(n) for chunk_names in names for n in chunk_names)
        self.chunk_count += 1

    def finish(self) -> list[str]:
        """The chunks of the update just finished (empty if none came); the session ends."""
        if self._chunks is None:
            raise EngineError("finish_weight_update called without a matching start_weight_update")
        chunks, self._chunks = self._chunks, None
        return chunks
