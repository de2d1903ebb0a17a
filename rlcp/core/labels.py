"""Worker labels and label selectors, in Kubernetes' syntax (docs/controller.md, "Labels and selectors").

Members carry labels from their source (static config, the HTTP listing, pod labels, a Ray
actor's description); reads and operations take a selector. Both follow Kubernetes exactly,
so an operator who knows `kubectl get -l` knows ours, and a pod's labels pass through as they
are. Pure and in the kernel: the controller filters with it, and rlctl could check a selector
before sending it.

    Labels            an immutable, hashable str -> str mapping whose keys and values are
                      checked (a frozen `WorkerSpec` holds one; pydantic reads a dict into it)
    parse_selector    "app=x,tier in (a,b),!canary" -> Selector (raises SelectorError)
    Selector.matches  Labels -> bool

Selector grammar (`k8s.io/apimachinery/pkg/labels/selector.go`): requirements joined by `,`
(AND); each is `key`, `!key`, `key=value`, `key==value`, `key!=value`, `key in (v1,v2)` or
`key notin (v1,v2)`. As in Kubernetes, `!=` and `notin` also match a member without the key.
An empty selector matches everything.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema

# Kubernetes' limits (apimachinery/pkg/util/validation): a name part of at most 63
# characters, alphanumeric at both ends with `-_.` inside; an optional DNS-subdomain prefix
# of at most 253; a value like a name part, or empty.
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_NAME_RE = re.compile(rf"^{_NAME}$")
_PREFIX_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
MAX_LABELS = 64  # more is a mistake, not a fleet; keeps a state document's size bounded
# Room for real selectors, and short enough that one sent in a query string (percent-encoded, up to
# 12 bytes a character) stays inside aiohttp's 8190-byte request line.
MAX_SELECTOR_CHARS = 512


def label_key_problem(key: str) -> str | None:
    """Why `key` is not a valid label key, or None."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _PREFIX_RE.match(prefix)):
        return f"label key {key!r}: the prefix must be a DNS subdomain (lowercase, at most 253 characters)"
    if len(name) > 63 or not _NAME_RE.match(name):
        return (
            f"label key {key!r}: the name must be 1-63 characters, alphanumeric at both ends, "
            "with '-', '_' or '.' inside"
        )
    return None


def label_value_problem(value: str) -> str | None:
    """Why `value` is not a valid label value, or None (empty is valid)."""
    if value == "" or (len(value) <= 63 and _NAME_RE.match(value)):
        return None
    return (
        f"label value {value!r}: at most 63 characters, alphanumeric at both ends, with '-', '_' or '.' "
        "inside (or empty)"
    )


class Labels(Mapping[str, str]):
    """A checked, immutable label set. Hashable, so a frozen spec holding one stays hashable;
    kept sorted, so two equal sets render alike."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, str] | None = None) -> None:
        items = dict(items or {})
        if len(items) > MAX_LABELS:
            raise ValueError(f"{len(items)} labels: at most {MAX_LABELS}")
        for key, value in items.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise ValueError(f"label {key!r}: keys and values are strings")
            problem = label_key_problem(key) or label_value_problem(value)
            if problem:
                raise ValueError(problem)
        self._items: dict[str, str] = dict(sorted(items.items()))

    def __getitem__(self, key: str) -> str:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(tuple(self._items.items()))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self._items) == dict(other)

    def __repr__(self) -> str:
        return f"Labels({self._items!r})"

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        as_dict = core_schema.dict_schema(core_schema.str_schema(), core_schema.str_schema())
        return core_schema.no_info_after_validator_function(
            cls, as_dict, serialization=core_schema.plain_serializer_function_ser_schema(dict, return_schema=as_dict)
        )


def labels_from(raw: object) -> Labels:
    """Labels from a document's `labels` field (a listing entry, an actor's description): absent
    or null is none; anything but an object of strings raises `ValueError` saying why."""
    if raw is None:
        return Labels()
    if not isinstance(raw, Mapping):
        raise ValueError(f"labels is a {type(raw).__name__}, not an object")
    return Labels(raw)


# -- selectors --------------------------------------------------------------------------------
Operator = Literal["exists", "absent", "eq", "ne", "in", "notin"]


class SelectorError(ValueError):
    """A selector that cannot be read; the message says where and why."""


@dataclass(frozen=True)
class Requirement:
    key: str
    op: Operator
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        has = self.key in labels
        if self.op == "exists":
            return has
        if self.op == "absent":
            return not has
        if self.op in ("eq", "in"):
            return has and labels[self.key] in self.values
        return not has or labels[self.key] not in self.values  # ne, notin: as Kubernetes does


@dataclass(frozen=True)
class Selector:
    text: str
    requirements: tuple[Requirement, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)


_TOKEN = re.compile(r"\s*(==|!=|=|\(|\)|,|!|[^\s=!(),]+)")


def _tokens(text: str) -> list[str]:
    out, pos = [], 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if m is None:  # unreachable with this pattern, kept so a change cannot loop forever
            raise SelectorError(f"cannot read the selector at character {pos + 1}")
        out.append(m.group(1))
        pos = m.end()
    return out


def parse_selector(text: str) -> Selector:
    """Read a Kubernetes label selector; raise `SelectorError` naming the problem."""
    if len(text) > MAX_SELECTOR_CHARS:
        raise SelectorError(f"the selector is {len(text)} characters long: at most {MAX_SELECTOR_CHARS}")
    tokens = _tokens(text)
    requirements: list[Requirement] = []
    i = 0

    def key_at(j: int) -> str:
        if j >= len(tokens) or tokens[j] in ("==", "!=", "=", "(", ")", ",", "!"):
            found = "the end" if j >= len(tokens) else repr(tokens[j])
            raise SelectorError(f"expected a label key, found {found}")
        problem = label_key_problem(tokens[j])
        if problem:
            raise SelectorError(problem)
        return tokens[j]

    def value_at(j: int) -> str:
        if j < len(tokens) and tokens[j] in ("==", "!=", "=", "(", "!"):
            raise SelectorError(f"expected a label value, found {tokens[j]!r}")
        if j >= len(tokens) or tokens[j] in (",", ")"):
            return ""  # `a=` (empty value) is valid, as in Kubernetes
        problem = label_value_problem(tokens[j])
        if problem:
            raise SelectorError(problem)
        return tokens[j]

    while i < len(tokens):
        if tokens[i] == "!":
            requirements.append(Requirement(key_at(i + 1), "absent"))
            i += 2
        else:
            key = key_at(i)
            i += 1
            op = tokens[i] if i < len(tokens) else ","
            if op == ",":
                requirements.append(Requirement(key, "exists"))
            elif op in ("=", "==", "!="):
                value = value_at(i + 1)
                requirements.append(Requirement(key, "ne" if op == "!=" else "eq", frozenset({value})))
                i += 1 if value == "" else 2
            elif op in ("in", "notin"):
                if i + 1 >= len(tokens) or tokens[i + 1] != "(":
                    raise SelectorError(f"{key} {op}: expected '(' and a list of values")
                values: set[str] = set()
                i += 2
                while True:
                    value = value_at(i)
                    values.add(value)
                    i += 0 if value == "" else 1
                    if i >= len(tokens):
                        raise SelectorError(f"{key} {op} (...): missing ')'")
                    if tokens[i] == ")":
                        i += 1
                        break
                    if tokens[i] != ",":
                        raise SelectorError(f"{key} {op} (...): expected ',' or ')', found {tokens[i]!r}")
                    i += 1
                requirements.append(Requirement(key, "in" if op == "in" else "notin", frozenset(values)))
            else:
                raise SelectorError(f"after {key!r}: expected '=', '==', '!=', 'in', 'notin' or ',', found {op!r}")
        if i < len(tokens):
            if tokens[i] != ",":
                raise SelectorError(f"expected ',' between requirements, found {tokens[i]!r}")
            i += 1
            if i >= len(tokens):
                raise SelectorError("the selector ends with ','")
    return Selector(text, tuple(requirements))
