"""Two fields the agent adds to vLLM's inference answers, so the trainers' own clients read
them unchanged. Pure code over parsed JSON and SSE bytes; `vllm_inference.py` applies it on
the way out.

- **Token names on tokens-mode logprobs.** vLLM 0.32's tokens-in/tokens-out route
  (`POST /inference/v1/generate`, `output_mode: "tokens"`, its default) answers each logprob
  entry as `{token_id, logprob, rank, top_logprobs}`. renderers' `generate()` (which verifiers'
  `TrainClient` and prime-rl use) and prime-rl's own inference server read the entry's `token`
  as `"token_id:<id>"`, the form vLLM gives in its text mode with `return_tokens_as_token_ids`.
  We add that `token` beside vLLM's own fields, only where an entry has a `token_id` and no
  `token`: vLLM-format clients see what they saw, and a chat/completions answer (whose
  entries carry a text `token` and no `token_id`) is never touched.
- **Weight-version spans on a stream's finishing chunk.** A non-streamed answer carries the
  spans in `X-RL-Weight-Versions`, but a stream's headers leave before any token exists. So
  the chunk that finishes a choice (its `finish_reason` set) carries `weight_versions`, the
  same list of `{version, start, end}` spans over output-token indexes as the header, as
  vLLM's own tokens-in/tokens-out stream does on its final chunk. OpenAI parsers ignore it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

Span = tuple[str, int, int]  # (version, start, end): output-token indexes, end exclusive
SpansOf = Callable[[int], list[Span] | None]  # the spans of a finished choice, by its index

_DATA = b"data: "
_EVENT_END = b"\n\n"
_FINISHED = re.compile(rb'"finish_reason"\s*:\s*"')  # a finish reason that is a string, not null


def name_token_ids(answer: Any) -> bool:
    """Add `token: "token_id:<id>"` to every logprob entry (and top candidate) of every
    choice that has a `token_id` but no `token`; True when anything was added."""
    changed = False
    choices = answer.get("choices") if isinstance(answer, dict) else None
    for choice in choices if isinstance(choices, list) else ():
        logprobs = choice.get("logprobs") if isinstance(choice, dict) else None
        content = logprobs.get("content") if isinstance(logprobs, dict) else None
        for entry in content if isinstance(content, list) else ():
            changed |= _name(entry)
            tops = entry.get("top_logprobs") if isinstance(entry, dict) else None
            for top in tops if isinstance(tops, list) else ():
                changed |= _name(top)
    return changed


def _name(entry: Any) -> bool:
    if not isinstance(entry, dict) or "token" in entry:
        return False
    token_id = entry.get("token_id")
    if not isinstance(token_id, int) or isinstance(token_id, bool):
        return False
    entry["token"] = f"token_id:{token_id}"
    return True


def add_finished_spans(chunk: Any, spans_of: SpansOf) -> bool:
    """Add `weight_versions` to each choice of a stream chunk that finishes here and has
    none yet; True when anything was added."""
    changed = False
    choices = chunk.get("choices") if isinstance(chunk, dict) else None
    for choice in choices if isinstance(choices, list) else ():
        if not isinstance(choice, dict) or choice.get("finish_reason") is None or choice.get("weight_versions"):
            continue
        index = choice.get("index", 0)
        spans = spans_of(index) if isinstance(index, int) else None
        if spans:
            choice["weight_versions"] = [{"version": v, "start": s, "end": e} for v, s, e in spans]
            changed = True
    return changed


def amend_json(body: bytes) -> bytes | None:
    """A non-streamed tokens-in/tokens-out answer with its logprob entries named, or None
    when nothing changes (then the original bytes go out untouched)."""
    if b'"token_id"' not in body:
        return None
    try:
        answer = json.loads(body)
    except ValueError:
        return None
    return _dump(answer) if name_token_ids(answer) else None


def amend_events(data: bytes, *, name_tokens: bool, spans_of: SpansOf | None) -> bytes:
    """One piece of an SSE stream with its events amended. vLLM writes whole events (each
    `data: {...}\\n\\n`); a piece that does not end on an event boundary goes out as it came.
    Only events that can need a change are parsed: this runs once per streamed token."""
    if not data.endswith(_EVENT_END):
        return data
    events = data[: -len(_EVENT_END)].split(_EVENT_END)
    out = [_amend_event(e, name_tokens=name_tokens, spans_of=spans_of) for e in events]
    return _EVENT_END.join(out) + _EVENT_END


def _amend_event(event: bytes, *, name_tokens: bool, spans_of: SpansOf | None) -> bytes:
    if not event.startswith(_DATA):
        return event
    wants_names = name_tokens and b'"token_id"' in event
    wants_spans = spans_of is not None and _FINISHED.search(event) is not None
    if not (wants_names or wants_spans):
        return event
    try:
        chunk = json.loads(event[len(_DATA) :])
    except ValueError:
        return event  # `[DONE]` and anything else that is not JSON
    changed = wants_names and name_token_ids(chunk)
    if wants_spans and spans_of is not None:
        changed |= add_finished_spans(chunk, spans_of)
    return _DATA + _dump(chunk) if changed else event


def _dump(value: Mapping[str, Any]) -> bytes:
    # Compact and UTF-8, as vLLM writes its own answers.
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
