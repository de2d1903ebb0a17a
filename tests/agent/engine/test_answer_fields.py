"""The fields the agent adds to vLLM's answers (rlcp/agent/engine/answer_fields.py), on the shapes
vLLM 0.32 writes: token names on tokens-mode logprobs that renderers' own parser accepts, and
spans on a stream's finishing chunk. The real engine's answers: tests/e2e/test_trainer_clients.py."""

from __future__ import annotations

import json

import pytest

from rlcp.agent.engine.answer_fields import add_finished_spans, amend_events, amend_json, name_token_ids


def tokens_answer(ids: list[int]) -> dict:
    """A non-streamed `/inference/v1/generate` answer in vLLM 0.32's tokens mode."""
    content = [
        {
            "token_id": t,
            "logprob": -0.5 - i,
            "rank": 1,
            "top_logprobs": [{"token_id": t, "logprob": -0.5 - i, "rank": 1}],
        }
        for i, t in enumerate(ids)
    ]
    return {
        "request_id": "r",
        "output_mode": "tokens",
        "choices": [
            {
                "index": 0,
                "finish_reason": "length",
                "token_ids": ids,
                "logprobs": {"content": content},
                "weight_versions": [{"version": "v1", "start": 0, "end": len(ids)}],
            }
        ],
    }


def test_tokens_mode_entries_get_the_name_renderers_parse_and_keep_vllms_fields():
    from renderers.client import _parse_completion_logprobs

    answer = tokens_answer([25, 126, 280])
    choice = answer["choices"][0]
    with pytest.raises(ValueError, match="token_id:25"):  # what renderers said of vLLM's own answer
        _parse_completion_logprobs(choice, choice["token_ids"])
    amended = json.loads(amend_json(json.dumps(answer).encode()))
    choice = amended["choices"][0]
    assert _parse_completion_logprobs(choice, choice["token_ids"]) == [-0.5, -1.5, -2.5]
    first = choice["logprobs"]["content"][0]
    assert first == {
        "token_id": 25,
        "logprob": -0.5,
        "rank": 1,
        "token": "token_id:25",
        "top_logprobs": [{"token_id": 25, "logprob": -0.5, "rank": 1, "token": "token_id:25"}],
    }


def test_text_entries_and_answers_without_logprobs_are_left_alone():
    chat = {
        "choices": [
            {
                "index": 0,
                "logprobs": {"content": [{"token": "hi", "logprob": -1.0, "bytes": [104, 105], "top_logprobs": []}]},
            }
        ]
    }
    assert not name_token_ids(chat)
    assert amend_json(json.dumps(chat).encode()) is None  # the bytes go out untouched
    assert amend_json(json.dumps({"choices": [{"index": 0, "logprobs": None}]}).encode()) is None
    assert amend_json(b'{"token_id": 1') is None  # not JSON: not ours to fix
    already = {"choices": [{"logprobs": {"content": [{"token_id": 3, "token": "token_id:3", "logprob": 0.0}]}}]}
    assert not name_token_ids(already)
    odd = {"choices": [{"logprobs": {"content": [{"token_id": True}, {"token_id": "7"}, "x", None]}}]}
    assert not name_token_ids(odd)


def sse(*chunks: dict | str) -> bytes:
    return b"".join(f"data: {c if isinstance(c, str) else json.dumps(c)}\n\n".encode() for c in chunks)


def test_the_finishing_chunk_of_each_choice_carries_its_spans():
    spans = {0: [("v1", 0, 3), ("v2", 3, 5)], 1: [("v2", 0, 5)]}
    piece = sse(
        {"choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": None}]},
        {"choices": [{"index": 1, "delta": {"content": "b"}, "finish_reason": "stop"}]},
        "[DONE]",
    )
    out = amend_events(piece, name_tokens=False, spans_of=spans.get)
    events = out.decode().split("\n\n")
    assert events[0] == piece.decode().split("\n\n")[0]  # a chunk that finishes nothing: the same bytes
    assert json.loads(events[1][6:])["choices"][0]["weight_versions"] == [{"version": "v2", "start": 0, "end": 5}]
    assert events[2] == "data: [DONE]" and out.endswith(b"\n\n")
    # vLLM's tokens stream sets them itself: not overwritten.
    own = {"choices": [{"index": 0, "finish_reason": "length", "weight_versions": [{"version": "v9"}]}]}
    assert not add_finished_spans(own, spans.get)
    # A piece that is not whole events goes out as it came.
    assert (
        amend_events(b'data: {"choices": [{"index": 0, "finish_reason": "stop"', name_tokens=False, spans_of=spans.get)
        == b'data: {"choices": [{"index": 0, "finish_reason": "stop"'
    )


def test_a_tokens_stream_names_each_chunks_entries():
    chunk = tokens_answer([7])
    chunk["choices"][0]["finish_reason"] = None
    out = amend_events(sse(chunk), name_tokens=True, spans_of=None)
    entry = json.loads(out[6:])["choices"][0]["logprobs"]["content"][0]
    assert entry["token"] == "token_id:7" and entry["token_id"] == 7
