"""Bad input to the agent's admin API, against the real vLLM engine.

Each case asserts the status, the error shape naming the field, and that nothing in
the engine changed: same weight version, pause state, adapters, and no operation ran.
"""

from __future__ import annotations

import os

import pytest

from rlcp.harness.http import call
from rlcp.harness.processes import AgentProcess

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]


def _cases(models: dict) -> list[tuple[str, str, str, object, int, str | None]]:
    root = models["base"].parent
    good_weights = str(models["weights-2"])
    return [
        # (id, method, path, body, status, field)
        ("unknown mode", "POST", "/pause?mode=bogus", None, 422, "mode"),
        ("negative timeout", "POST", "/pause?mode=keep&timeout_s=-1", None, 422, "timeout_s"),
        ("missing version", "POST", "/v1/agent/weights/disk", {"path": good_weights}, 422, "version"),
        ("path wrong type", "POST", "/v1/agent/weights/disk", {"path": 123, "version": "x"}, 422, "path"),
        (
            "unknown field",
            "POST",
            "/v1/agent/weights/disk",
            {"path": good_weights, "version": "x", "pth": 1},
            422,
            "pth",
        ),
        ("relative path", "POST", "/v1/agent/weights/disk", {"path": "weights-2", "version": "x"}, 403, "path"),
        ("outside roots", "POST", "/v1/agent/weights/disk", {"path": "/etc", "version": "x"}, 403, "path"),
        ("traversal", "POST", "/v1/agent/weights/disk", {"path": f"{root}/../../../etc", "version": "x"}, 403, "path"),
        ("symlink out", "POST", "/v1/agent/weights/disk", {"path": f"{root}/escape", "version": "x"}, 403, "path"),
        ("missing dir", "POST", "/v1/agent/weights/disk", {"path": f"{root}/nope", "version": "x"}, 400, "path"),
        (
            "no safetensors",
            "POST",
            "/v1/agent/weights/disk",
            {"path": str(models["lora-11"]), "version": "x"},
            400,
            "path",
        ),
        ("not json", "POST", "/v1/agent/weights/disk", b"{not json", 400, "body"),
        ("json array", "POST", "/v1/agent/weights/disk", b"[1, 2]", 400, "body"),
        ("empty body", "POST", "/v1/agent/weights/disk", b"", 400, "body"),
        ("bad lora name", "POST", "/v1/agent/loras", {"name": "a b", "path": str(models["lora-11"])}, 422, "name"),
        ("lora not an adapter", "POST", "/v1/agent/loras", {"name": "x", "path": good_weights}, 400, "path"),
        ("lora outside roots", "POST", "/v1/agent/loras", {"name": "x", "path": "/tmp"}, 403, "path"),
        ("unload unknown", "DELETE", "/v1/agent/loras/never-loaded", None, 404, "name"),
        ("version missing", "POST", "/update_weight_version", {}, 422, "new_version"),
        ("checker action", "POST", "/weight_checker", {"action": "explode"}, 422, "action"),
        ("compare no baseline", "POST", "/weight_checker", {"action": "compare"}, 422, "baseline"),
        ("desired wrong type", "PUT", "/v1/agent/desired", {"weight_version": 5}, 422, "weight_version"),
        ("init without info", "POST", "/init_weight_transfer_engine", {}, 422, "init_info"),
        ("oversized body", "POST", "/v1/agent/weights/disk", b"{" + b" " * (2 << 20) + b"}", 413, "body"),
        # The whole update in one call: refused before the desired version is learnt or anything pauses.
        *[(f"update: {name}", "POST", UPDATE, body, status, field) for name, body, status, field in _update(models)],
    ]


UPDATE = "/v1/agent/weights/update"


def _update(models: dict) -> list[tuple[str, object, int, str]]:
    root, good = models["base"].parent, str(models["weights-2"])
    return [
        # (id, body, status, field)
        ("path missing", {"version": "x"}, 422, "path"),
        ("path empty", {"path": "", "version": "x"}, 422, "path"),
        ("path not a string", {"path": ["/w"], "version": "x"}, 422, "path"),
        ("path a file", {"path": str(models["weights-2"] / "config.json"), "version": "x"}, 400, "path"),
        ("path missing dir", {"path": f"{root}/nope", "version": "x"}, 400, "path"),
        ("path relative", {"path": "weights-2", "version": "x"}, 403, "path"),
        ("path outside roots", {"path": "/etc", "version": "x"}, 403, "path"),
        ("path traversal", {"path": f"{root}/../../../etc", "version": "x"}, 403, "path"),
        ("path NUL", {"path": f"{good}\x00", "version": "x"}, 400, "path"),
        ("no safetensors", {"path": str(models["lora-11"]), "version": "x"}, 400, "path"),
        ("version missing", {"path": good}, 422, "version"),
        ("version with a space", {"path": good, "version": "v 2"}, 422, "version"),
        ("version non-ASCII", {"path": good, "version": "v\u00e9"}, 422, "version"),
        ("version too long", {"path": good, "version": "v" * 257}, 422, "version"),
        ("version not a string", {"path": good, "version": 2}, 422, "version"),
        ("mode unknown", {"path": good, "version": "x", "mode": "bogus"}, 422, "mode"),
        ("timeout negative", {"path": good, "version": "x", "timeout_s": -1}, 422, "timeout_s"),
        ("resume not a bool", {"path": good, "version": "x", "resume": "yes"}, 422, "resume"),
        ("checksums a list", {"path": good, "version": "x", "expected_checksums": ["a"]}, 422, "expected_checksums"),
        ("checksums a string", {"path": good, "version": "x", "expected_checksums": "a"}, 422, "expected_checksums"),
        (
            "checksum not a string",
            {"path": good, "version": "x", "resume": True, "expected_checksums": {"w": 1}},
            422,
            "expected_checksums.w",
        ),
        ("unknown field", {"path": good, "version": "x", "resum": True}, 422, "resum"),
        ("not json", b"{not json", 400, "body"),
        ("json array", b"[1, 2]", 400, "body"),
        ("empty body", b"", 400, "body"),
    ]


@pytest.fixture(scope="module")
def escape_link(tiny_models):
    link = tiny_models["base"].parent / "escape"
    if not link.exists():
        os.symlink("/etc", link)
    return link


async def _snapshot(http, agent: AgentProcess) -> dict:
    status, st = await call(http, "GET", agent.admin_url + "/v1/agent/state")
    assert status == 200
    return {k: st[k] for k in ("weight_version", "paused", "loras", "desired_weight_version")} | {
        "operations": [op["id"] for op in st["last_operations"]]
    }


# The cases need the session's models, made once the session starts: parametrized by index.
N_CASES = 49


@pytest.mark.parametrize("case", range(N_CASES))
async def test_bad_input_is_a_4xx_naming_the_field_and_touches_nothing(
    case, http, vllm_agent, tiny_models, escape_link
):
    cases = _cases(tiny_models)
    assert len(cases) == N_CASES
    name, method, path, body, want_status, want_field = cases[case]
    before = await _snapshot(http, vllm_agent)
    kwargs = {"data": body} if isinstance(body, bytes) else {"body": body}
    status, resp = await call(http, method, vllm_agent.admin_url + path, headers=vllm_agent.auth, **kwargs)
    assert status == want_status, (name, resp)
    assert set(resp) == {"error"} and resp["error"]["code"] and resp["error"]["message"], name
    assert resp["error"].get("field") == want_field, (name, resp)
    assert await _snapshot(http, vllm_agent) == before, f"{name}: state changed"


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "test-token"}],
    ids=["missing", "wrong", "no-scheme"],
)
@pytest.mark.parametrize(
    "method,path",
    [
        ("POST", "/pause?mode=abort"),
        ("POST", "/resume"),
        ("POST", "/v1/agent/weights/disk"),
        ("POST", UPDATE),
        ("POST", "/v1/agent/loras"),
        ("DELETE", "/v1/agent/loras/x"),
        ("PUT", "/v1/agent/desired"),
        ("POST", "/update_weight_version"),
        ("POST", "/start_weight_update"),
    ],
)
async def test_mutating_routes_need_the_token(method, path, headers, http, vllm_agent):
    before = await _snapshot(http, vllm_agent)
    status, resp = await call(http, method, vllm_agent.admin_url + path, headers=headers, body={})
    assert status == 401 and resp["error"]["code"] == "unauthorized"
    assert await _snapshot(http, vllm_agent) == before


async def test_unknown_route_is_a_json_404(http, vllm_agent):
    status, resp = await call(http, "GET", vllm_agent.admin_url + "/nope")
    assert status == 404 and resp["error"]["code"] == "not_found"


async def test_the_token_never_reaches_the_log(http, vllm_agent):
    await call(http, "POST", vllm_agent.admin_url + "/resume", headers={"Authorization": "Bearer wrong-guess"})
    await call(http, "POST", vllm_agent.admin_url + "/resume", headers=vllm_agent.auth)
    log = vllm_agent.log_path.read_text(errors="replace")
    assert '"route": "/resume"' in log  # the calls were logged...
    assert vllm_agent.token not in log and "wrong-guess" not in log  # ...without any token
