"""Settings: YAML < environment < explicit values; tokens inline or from a file."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rlcp.agent.settings import load_settings as load_agent
from rlcp.controlplane.settings import load_settings as load_controller


def test_env_overrides_yaml_and_nested_fields(tmp_path, monkeypatch):
    config = tmp_path / "agent.yaml"
    config.write_text("agent_id: from-yaml\nadmin: {port: 9001, token: yaml-token}\nengine: {kind: sim}\n")
    monkeypatch.setenv("RLAGENT_ADMIN__PORT", "9002")
    s = load_agent(config)
    assert (s.agent_id, s.admin.port, s.admin.resolved_token()) == ("from-yaml", 9002, "yaml-token")
    assert load_agent(config, agent_id="explicit").agent_id == "explicit"


def test_token_from_a_file_and_missing_token(tmp_path):
    secret = tmp_path / "token"
    secret.write_text("s3cret\n")
    s = load_controller(api={"token_file": str(secret)}, workers={"token_file": str(secret)})
    assert s.api.resolved_token() == "s3cret" and s.workers.resolved_token() == "s3cret"
    with pytest.raises(ValueError, match="RLCP_API__TOKEN"):
        load_controller().api.resolved_token()
    assert "s3cret" not in repr(load_controller(api={"token": "s3cret"}))  # SecretStr never prints


def test_unknown_fields_and_bad_values_are_refused(tmp_path):
    with pytest.raises(ValidationError, match="prot"):
        load_controller(api={"prot": 1})
    with pytest.raises(ValidationError, match="engine.model"):
        load_agent(engine={"kind": "vllm"})
    with pytest.raises(FileNotFoundError):
        load_agent(tmp_path / "missing.yaml")


def test_shipped_example_configs_load():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "configs"
    assert load_controller(root / "local.yaml").discovery.static[1].id == "local-1"
    assert load_agent(root / "agent-local.yaml").engine.served_model_name == "tiny"


def test_static_members_carry_labels_and_a_bad_label_is_a_settings_error():
    ok = load_controller(
        discovery={
            "kind": "static",
            "static": [
                {"id": "w0", "admin_url": "http://w0:9000", "labels": {"role": "policy", "rlcp.io/model": "qwen3"}}
            ],
        }
    )
    assert dict(ok.discovery.static[0].labels) == {"role": "policy", "rlcp.io/model": "qwen3"}
    with pytest.raises(ValidationError, match=r"discovery\.static\.0\.labels[\s\S]*label value 'not ok'"):
        load_controller(
            discovery={
                "kind": "static",
                "static": [{"id": "w0", "admin_url": "http://w0:9000", "labels": {"role": "not ok"}}],
            }
        )


def test_engine_route_allowlist_defaults_overrides_and_bad_names():
    defaults = load_controller().engine_routes.allow
    assert defaults["agent"]["is_paused"] == "GET" and "sleep" not in defaults["vllm"] and defaults["dynamo"] == {}
    changed = load_controller(engine_routes={"allow": {"vllm": {"sleep": "POST", "wake_up": "POST"}}}).engine_routes
    assert changed.allow["vllm"] == {"sleep": "POST", "wake_up": "POST"}  # a flavor named is replaced whole
    assert changed.allow["agent"] == defaults["agent"]  # the others keep their defaults
    with pytest.raises(ValidationError, match="'../admin' is not one path segment"):
        load_controller(engine_routes={"allow": {"agent": {"../admin": "POST"}}})
    with pytest.raises(ValidationError, match="engine_routes.allow.agent.x"):
        load_controller(engine_routes={"allow": {"agent": {"x": "DELETE"}}})
