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
    reader = _SelectorReader(_tokens(text))
    requirements: list[Requirement] = []
    while not reader.at_end():
        requirements.append(reader.requirement())
        reader.separator()
    return Selector(text, tuple(requirements))


_NOT_A_KEY = frozenset({"==", "!=", "=", "(", ")", ",", "!"})
_NOT_A_VALUE = frozenset({"==", "!=", "=", "(", "!"})


class _SelectorReader:
    """A cursor over a selector's tokens; each method reads one part of the grammar or raises."""

    def __init__(self, tokens: list[str]) -> None:
        self._tokens = tokens
        self._i = 0

    def at_end(self) -> bool:
        return self._i >= len(self._tokens)

    def _peek(self) -> str | None:
        return None if self.at_end() else self._tokens[self._i]

    def key(self) -> str:
        token = self._peek()
        if token is None or token in _NOT_A_KEY:
            raise SelectorError(f"expected a label key, found {'the end' if token is None else repr(token)}")
        if problem := label_key_problem(token):
            raise SelectorError(problem)
        self._i += 1
        return token

    def value(self) -> str:
        token = self._peek()
        if token is not None and token in _NOT_A_VALUE:
            raise SelectorError(f"expected a label value, found {token!r}")
        if token is None or token in (",", ")"):
            return ""  # `a=` (empty value) is valid, as in Kubernetes
        if problem := label_value_problem(token):
            raise SelectorError(problem)
        self._i += 1
        return token

    def requirement(self) -> Requirement:
        if self._peek() == "!":
            self._i += 1
            return Requirement(self.key(), "absent")
        key = self.key()
        op = self._peek() or ","
        if op == ",":
            return Requirement(key, "exists")
        self._i += 1
        if op in ("=", "==", "!="):
            return Requirement(key, "ne" if op == "!=" else "eq", frozenset({self.value()}))
        if op in ("in", "notin"):
            return Requirement(key, "in" if op == "in" else "notin", self._value_list(key, op))
        raise SelectorError(f"after {key!r}: expected '=', '==', '!=', 'in', 'notin' or ',', found {op!r}")

    def _value_list(self, key: str, op: str) -> frozenset[str]:
        """`(v1, v2, ...)` after `in` / `notin`."""
        if self._peek() != "(":
            raise SelectorError(f"{key} {op}: expected '(' and a list of values")
        self._i += 1
        values = {self.value()}
        while (token := self._peek()) != ")":
            if token is None:
                raise SelectorError(f"{key} {op} (...): missing ')'")
            if token != ",":
                raise SelectorError(f"{key} {op} (...): expected ',' or ')', found {token!r}")
            self._i += 1
            values.add(self.value())
        self._i += 1
        return frozenset(values)

    def separator(self) -> None:
        """The ',' between requirements, unless the selector ends here."""
        token = self._peek()
        if token is None:
            return
        if token != ",":
            raise SelectorError(f"expected ',' between requirements, found {token!r}")
        self._i += 1
        if self.at_end():
            raise SelectorError("the selector ends with ','")
