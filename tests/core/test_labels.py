"""Labels and label selectors (rlcp/core/labels.py): Kubernetes' label syntax, and its selector
grammar, matched as `kubectl get -l` matches."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rlcp.controlplane.workerspec import WorkerSpec
from rlcp.core.labels import Labels, SelectorError, labels_from, parse_selector

L = Labels({"role": "policy", "zone": "a", "app.kubernetes.io/name": "vllm"})


@pytest.mark.parametrize(
    "selector,matches",
    [
        ("", True),
        ("role=policy", True),
        ("role==policy", True),
        ("role=reference", False),
        ("role!=policy", False),
        ("role!=reference", True),
        ("missing!=x", True),  # != matches a missing key
        ("zone in (a,b)", True),
        ("zone in (b, c)", False),
        ("missing in (a)", False),
        ("zone notin (b)", True),
        ("zone notin (a)", False),
        ("missing notin (a)", True),
        ("role", True),
        ("missing", False),
        ("!missing", True),
        ("!role", False),
        ("role=policy,zone=a", True),
        ("role=policy,zone=b", False),
        (" role = policy , zone in ( a ) ", True),
        ("app.kubernetes.io/name=vllm", True),
        ("tier=", False),
        ("tier!=", True),
    ],
)
def test_selectors_match_as_kubernetes_does(selector: str, matches: bool) -> None:
    assert parse_selector(selector).matches(L) is matches


def test_an_empty_value_matches_an_empty_label() -> None:
    assert parse_selector("tier=").matches(Labels({"tier": ""}))
    assert parse_selector("tier in (,x)").matches(Labels({"tier": ""}))


@pytest.mark.parametrize(
    "selector,why",
    [
        ("role in policy", "expected '('"),
        ("role in (a", "missing ')'"),
        ("role in (a b)", "expected ',' or ')'"),
        ("role=policy,", "ends with ','"),
        (",role", "expected a label key"),
        ("=policy", "expected a label key"),
        ("role policy", "after 'role'"),
        ("role=a=b", "expected ','"),
        ("!", "found the end"),
        ("role=(a)", "expected a label value"),
        ("-role=a", "label key '-role'"),
        ("Role.X/y=a", "prefix must be a DNS subdomain"),
        ("role=" + "a" * 64, "at most 63"),
        ("role=a b", "expected ','"),
        ("role=\x00", "label value"),
        ("a" * 513, "at most 512"),
    ],
)
def test_bad_selectors_say_why(selector: str, why: str) -> None:
    with pytest.raises(SelectorError) as err:
        parse_selector(selector)
    assert why in str(err.value), str(err.value)


def test_labels_are_checked_immutable_hashable_and_sorted() -> None:
    assert list(Labels({"b": "1", "a": "2"})) == ["a", "b"]
    assert Labels({"a": "1"}) == {"a": "1"} and hash(Labels({"a": "1"})) == hash(Labels({"a": "1"}))
    with pytest.raises(TypeError):
        Labels({"a": "1"})["a"] = "2"  # type: ignore[index]
    for bad in ({"bad key": "x"}, {"a": "not ok"}, {"/a": "x"}, {"a" * 64: "x"}, {f"k{i}": "v" for i in range(65)}):
        with pytest.raises(ValueError):
            Labels(bad)
    assert labels_from(None) == {}
    with pytest.raises(ValueError, match="not an object"):
        labels_from(["a"])


def test_a_spec_holds_labels_frozen_and_a_bad_one_is_a_clear_error() -> None:
    spec = WorkerSpec(id="w", admin_url="http://w:1", labels={"role": "policy"})
    assert spec.model_dump(mode="json")["labels"] == {"role": "policy"}
    assert spec == WorkerSpec.model_validate(spec.model_dump(mode="json")) and hash(spec)
    assert WorkerSpec(id="w", admin_url="http://w:1").labels == {}
    with pytest.raises(ValidationError, match="label key 'bad key'"):
        WorkerSpec(id="w", admin_url="http://w:1", labels={"bad key": "x"})
