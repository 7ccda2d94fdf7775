"""The package layout enforces the architecture (docs/architecture.md).

Each package ("room") may import only the rooms beneath it; no module imports itself back
through a chain (no cycle, function-level imports included); importing a room at run time
loads nothing above it; the graph manager's parts sit beneath the manager; no module reads
another object's private names; no two modules share a file name; and every file stays
small (at most 400 lines).
"""

from __future__ import annotations

import ast
import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.paths import ROOT

PACKAGE = ROOT / "staticattn"

#: Room -> the rooms it may import. Rooms not listed (``demo``, ``__main__``, the top-level
#: ``__init__``) sit on top and may import anything.
ALLOWED = {
    "errors": set(),
    "lazy": set(),
    "model": {"errors"},
    "arena": {"errors", "model"},
    # The oracle: plain loops from the spec, independent of everything it checks (the
    # arena only names its config type).
    "reference": {"arena", "model"},
    "kernels": {"errors"},
    # Every check of a step before anything is written: host arrays, views, block ids,
    # extents, replay starts, image spans, DCP steps.
    "validation": {"errors", "model", "arena"},
    "staging": {"errors", "model", "arena", "kernels", "validation"},
    "builders": {"errors", "model", "arena", "kernels", "validation", "staging"},
    "graphs": {"errors", "model", "arena", "kernels", "validation", "staging", "builders"},
    "consumers": {"errors", "model", "arena", "kernels", "validation", "staging", "builders"},
    "bench": {"errors", "model", "arena", "validation", "staging", "builders", "graphs"},
    "checks": {"errors", "model", "arena", "validation", "staging", "builders", "graphs",
               "bench", "reference", "lazy"},
    # The PCP demo checks each rank's metadata against the oracle, as checks/ does.
    "distributed": {"errors", "model", "arena", "kernels", "validation", "staging",
                    "builders", "graphs", "consumers", "bench", "reference"},
}
#: Rooms inside ``builders``, by concern -> the rooms of ``builders`` each may import. The
#: core (``builders``: the contract, the batch) imports none of them; the package's
#: ``__init__`` re-exports them all. The indexer, SWA and compressed builders never import
#: each other.
BUILDER_ROOMS = {
    "builders": set(),
    "builders.attention_utils": {"builders"},
    "builders.indexer": {"builders", "builders.attention_utils"},
    "builders.swa": {"builders", "builders.attention_utils"},
    "builders.compressed": {"builders", "builders.attention_utils"},
    "builders.pcp": {"builders"},
}
#: Rooms inside ``kernels`` and ``consumers``, by concern -> the rooms of the same package each
#: may import. ``runtime`` (how a kernel runs) is the base of every kernel room; the step-count
#: helpers (``staging``) serve every kernel of a graph of device-decided counts; the indexer
#: reads DCP ownership and the compressed slot gate, the compressed kernels DCP ownership (a
#: rank's share of V4.1's sharded entries), and so do the PCP kernels (a PCP + DCP rank's
#: slots and shares). The consumer rooms stand side by side, but for the
#: real kernels' DCP path, which merges its ranks' partial outputs with the DCP room's
#: collectives.
SUB_ROOMS = {
    "kernels": {"runtime": set(), "staging": {"runtime"}, "dcp": {"runtime"},
                "compressed": {"runtime", "staging", "dcp"}, "swa": {"runtime", "staging"},
                "indexer": {"runtime", "staging", "dcp", "compressed"},
                "pcp": {"runtime", "dcp"}},
    "consumers": {"emulated": set(), "real": {"dcp"}, "dcp": set()},
}
#: The modules of ``graphs``, bottom up: each may import only those before it. The
#: manager's parts (pool, table, capturer, eager, in-place and array steps) sit beneath it
#: and never import it; context buckets and device-length steps build on the manager.
GRAPH_MODULES = [
    "python_gc", "introspect", "graph_launch", "sizes", "captured", "options", "branches",
    "pool", "dispatch", "recorded_launches", "capturer", "eager", "in_place", "runner",
    "manager", "contexts", "device_steps",
]
#: Private names read off another object, each with its reason: ``torch`` keeps an op's
#: schema on ``_schema`` (no public spelling).
FOREIGN_PRIVATE = {("staticattn.checks.watch", "func._schema")}
MAX_LINES = 400
#: What ``import staticattn`` itself loads (PEP 562 exports), whatever room comes after it.
ROOT_LOADS = {"lazy"}


def _beneath(room: str) -> set[str]:
    """Every room ``room`` may load, directly or through the rooms it imports."""
    seen: set[str] = set()
    todo = list(ALLOWED[room])
    while todo:
        r = todo.pop()
        if r not in seen:
            seen.add(r)
            todo += ALLOWED[r]
    return seen


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _builder_room(module: str) -> str | None:
    """The room of a ``builders`` module (None for the package's ``__init__``)."""
    parts = module.split(".")
    if len(parts) == 2:
        return None
    sub = f"builders.{parts[2]}"
    return sub if sub in BUILDER_ROOMS else "builders"


def _imports(path: Path) -> set[str]:
    """Every staticattn module ``path`` imports, at module level or inside a function."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("staticattn")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.startswith("staticattn"):
                found.add(node.module)
                # ``from staticattn.kernels import swa_decode`` imports a module too.
                found |= {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in found if m in _modules()}


@functools.cache
def _modules() -> frozenset[str]:
    return frozenset(_module_name(p) for p in PACKAGE.rglob("*.py"))


@functools.cache
def _graph() -> dict[str, set[str]]:
    """Each module's staticattn imports, read once per session (no test changes it)."""
    return {_module_name(p): _imports(p) for p in PACKAGE.rglob("*.py")}


def test_rooms_import_only_rooms_beneath():
    bad = []
    for module, deps in _graph().items():
        room = _room(module)
        if room not in ALLOWED:
            continue
        for dep in deps:
            dep_room = _room(dep)
            if dep_room != room and dep_room not in ALLOWED[room]:
                bad.append(f"{module} imports {dep} ({room} -> {dep_room})")
    assert not bad, "imports against the layering:\n" + "\n".join(sorted(bad))


def test_builder_rooms_import_only_their_neighbours():
    graph = _graph()
    rooms = {m: r for m in graph if _room(m) == "builders" and (r := _builder_room(m))}
    assert set(rooms.values()) == set(BUILDER_ROOMS), "a room of builders/ has no module"
    bad = []
    for module, room in rooms.items():
        for dep in graph[module]:
            dep_room = _builder_room(dep) if _room(dep) == "builders" else None
            if dep_room and dep_room != room and dep_room not in BUILDER_ROOMS[room]:
                bad.append(f"{module} imports {dep} ({room} -> {dep_room})")
            if _room(dep) == "builders" and dep_room is None:
                bad.append(f"{module} imports the builders package itself")
    assert not bad, "imports against the builders' rooms:\n" + "\n".join(sorted(bad))


@pytest.mark.parametrize("package", sorted(SUB_ROOMS))
def test_sub_rooms_import_only_their_neighbours(package):
    rooms = SUB_ROOMS[package]
    graph = _graph()
    found = {m.split(".")[2] for m in graph
             if m.startswith(f"staticattn.{package}.") and len(m.split(".")) > 3}
    assert found == set(rooms), f"{package}/ has rooms {sorted(found)}, the test {sorted(rooms)}"
    bad = []
    for module, deps in graph.items():
        parts = module.split(".")
        if len(parts) < 4 or parts[1] != package:
            continue
        for dep in deps:
            dep_parts = dep.split(".")
            if len(dep_parts) > 2 and dep_parts[1] == package and dep_parts[2] != parts[2] \
                    and dep_parts[2] not in rooms[parts[2]]:
                bad.append(f"{module} imports {dep}")
    assert not bad, f"imports against {package}/' rooms:\n" + "\n".join(sorted(bad))


def test_graph_parts_sit_beneath_the_manager():
    graph = _graph()
    modules = {m.rsplit(".", 1)[1] for m in graph if m.startswith("staticattn.graphs.")}
    assert modules == set(GRAPH_MODULES), "graphs/ and GRAPH_MODULES differ"
    bad = []
    for i, name in enumerate(GRAPH_MODULES):
        for dep in graph[f"staticattn.graphs.{name}"]:
            if dep.startswith("staticattn.graphs."):
                dep_name = dep.rsplit(".", 1)[1]
                if dep_name not in GRAPH_MODULES[:i]:
                    bad.append(f"graphs.{name} imports graphs.{dep_name}")
    assert not bad, "graphs modules importing upwards:\n" + "\n".join(sorted(bad))


def _private_reads(path: Path) -> list[str]:
    """``x._name`` read off anything but ``self``, ``cls`` or an imported module."""
    tree = ast.parse(path.read_text(), filename=str(path))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            imported |= {(a.asname or a.name).split(".")[0] for a in node.names}
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                and not node.attr.startswith("__")):
            owner = node.value
            while isinstance(owner, ast.Attribute):
                owner = owner.value
            if not (isinstance(owner, ast.Name) and (
                    owner.id in ("self", "cls") and isinstance(node.value, ast.Name)
                    or owner.id in imported)):
                found.append(ast.unparse(node))
    return found


def test_no_module_reads_another_objects_private_names():
    bad = [f"{_module_name(p)}: {read}" for p in PACKAGE.rglob("*.py")
           for read in _private_reads(p) if (_module_name(p), read) not in FOREIGN_PRIVATE]
    assert not bad, "private names read across objects:\n" + "\n".join(sorted(bad))


def test_the_reference_is_independent_of_what_it_checks():
    """The oracle imports no kernel, builder, staging or graph code, and none of them (nor
    anything beneath them) may import the oracle: a shared mistake cannot agree with itself."""
    checked = {"kernels", "staging", "builders", "graphs"}
    assert not _beneath("reference") & checked
    assert not any("reference" in _beneath(room) for room in checked)
    assert {_room(m) for m in _graph()} >= {"reference"}


def test_no_import_cycle():
    graph = _graph()
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            # A package's __init__ re-exports its modules: importing one of them from the
            # package itself is not a cycle through code.
            if dep == node or node.startswith(dep + ".") or dep.startswith(node + "."):
                continue
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


#: One interpreter imports torch and ``staticattn`` (which loads ``ROOT_LOADS`` alone), then
#: forks a child per room: each child imports its room's modules and reports the rooms
#: loaded, as a fresh interpreter would, without importing torch a dozen times.
_ROOM_LOADS = """
import importlib, json, os, sys
import torch, staticattn
rooms = json.loads(sys.argv[1])
out = {}
for room, modules in rooms.items():
    read, write = os.pipe()
    if os.fork() == 0:
        os.close(read)
        try:
            for m in modules:
                importlib.import_module(m)
            msg = sorted({m.split('.')[1] for m in sys.modules if m.startswith('staticattn.')})
        except BaseException as e:
            msg = f"{type(e).__name__}: {e}"
        os.write(write, json.dumps(msg).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        out[room] = json.loads(f.read())
    os.wait()
print(json.dumps(out))
"""


@functools.cache
def _room_loads() -> dict[str, list[str] | str]:
    """Per room, the rooms importing all its modules loads (or the import's error)."""
    rooms = {room: sorted(m for m in _graph() if _room(m) == room) for room in ALLOWED}
    done = subprocess.run([sys.executable, "-c", _ROOM_LOADS, json.dumps(rooms)],
                          capture_output=True, text=True, cwd=PACKAGE.parent, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("room", sorted(ALLOWED))
def test_importing_a_room_loads_nothing_above_it(room):
    loads = _room_loads()[room]
    assert isinstance(loads, list), f"importing {room}: {loads}"
    loaded = set(loads) - {room} - ROOT_LOADS
    assert loaded <= _beneath(room), f"importing {room} loaded {sorted(loaded - _beneath(room))}"


def test_importing_the_package_loads_only_its_lazy_exports():
    """``import staticattn`` (which importing any room does first) loads ``lazy`` alone, and
    no torch: the public names are resolved on first use."""
    script = ("import sys, staticattn\n"
              "print(' '.join(sorted({m.split('.')[1] for m in sys.modules "
              "if m.startswith('staticattn.')})), 'torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=PACKAGE.parent, timeout=300)
    assert done.stdout.split() == [*sorted(ROOT_LOADS), "False"], done.stdout + done.stderr


#: File names several rooms use for the same part of a parallel structure: each builder
#: room has its builder and its metadata record.
SHARED_NAMES = {"builder.py", "metadata.py"}


def test_no_two_modules_share_a_file_name():
    """One meaning per word: two modules of one name would be two things read alike (the
    builder rooms' parallel parts excepted)."""
    seen: dict[str, list[str]] = {}
    for p in PACKAGE.rglob("*.py"):
        if p.name != "__init__.py" and p.name not in SHARED_NAMES:
            seen.setdefault(p.name, []).append(str(p.relative_to(PACKAGE)))
    twins = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not twins, f"modules sharing a file name: {twins}"


def test_files_stay_small():
    big = {str(p.relative_to(PACKAGE.parent)): n for p in PACKAGE.rglob("*.py")
           if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not big, f"files over {MAX_LINES} lines (one concept a file): {big}"


def test_public_api_from_the_top_level():
    import staticattn

    names = set(staticattn.__all__) - {"__version__"}
    assert names == set(staticattn._EXPORTS)
    for name in sorted(names):
        assert getattr(staticattn, name).__name__ == name
