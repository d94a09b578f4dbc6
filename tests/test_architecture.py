"""The shape of the code, enforced: imports point one way and never circle.

- The store is built in layers, each a package whose name says what it holds (``LAYERS``;
  docs/design.md, "Layers"). Bottom to top:

  - ``formats`` (``store/formats/``, with the pure session model ``store/model/`` and pi's file
    format ``store/pi/``): bytes and names, no I/O;
  - ``backends`` (``store/backends/``, and Redis's ``coordination/``): object stores and Redis;
    formats and backends sit side by side at the bottom and know nothing of each other;
  - ``protocol`` (``store/protocol/``): the store's protocols on objects and Redis;
  - ``lifecycle`` (``store/lifecycle/``): a session's create, fork and delete, retention and
    the trash, the maintenance thread;
  - ``facade``: ``store/__init__.py`` and the modules directly in ``store/`` (``SessionStore``,
    the asyncio facade, pi's ``SessionManager`` and import);
  - ``shells``: the programs and services built on the facade (``store/cli``, ``store/http``,
    ``store/adapters``, ``store/streams``, ``store/demo``, ``compactor/``).

  A module imports from its own layer and the layers below it, never above; the error tree,
  the clock, the fault hooks, the retry policy and the metrics (``SHARED``) are imported from
  anywhere and import only each other. Every module is in a layer.
- Nothing under ``store/`` imports ``compactor/`` (``store/cli`` and ``store/demo``, the
  programs built on both, may).
- Nothing of the store's core imports ``store/adapters/`` (the framework adapters are built on
  the store's public API; only the command line may use them), and no adapter imports another.
- ``coordination/`` imports only the store's errors and retry policy (and itself): it is the
  Redis boundary, not a user of the store.
- No import circles among the project's modules. Every import counts, including those inside
  functions (an import moved into a function to dodge a circle is still a circle) and those
  under ``if TYPE_CHECKING:`` (a circle a type checker has to follow is one a reader has to
  follow too). ``from package import module`` is an import of that module.
- No module but the facade (``store/core.py``) reads a private attribute (a leading ``_``) of a
  ``SessionStore``: satellites take the ``StoreContext`` and the protocol objects, or the
  store's public methods.
- No module is over 600 lines (``MAX_LINES``) but the Lua scripts (``coordination/scripts.py``,
  one named constant a script, each with its header): a longer one holds more than one
  concern, and is split by concern.
- The library reaches into no dependency's private modules or names (``redis._parsers``: a
  dependency's upgrade may change them without notice), and never changes the host process's
  interpreter-wide state (its garbage collector, its thread switch interval): it is a guest.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("store", "coordination", "compactor")


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imported_names(name: str, path: Path) -> Iterator[str]:
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names = [f"{module}.{alias.name}" for alias in node.names]
            # ``from store.backends import creates`` imports the module ``store.backends.creates``;
            # ``from store.core import SessionStore`` imports ``store.core``.
            if not all(n in MODULES for n in names):
                yield module
            yield from names


def _resolve(imported: str) -> str | None:
    while imported and imported not in MODULES:
        imported = imported.rpartition(".")[0]
    return imported or None


@functools.cache
def _graph() -> dict[str, set[str]]:
    """Each module's imports among the project's modules (parsed when a test first asks: not
    at collection, which every worker does)."""
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        deps = {_resolve(i) for i in _imported_names(name, path)}
        graph[name] = {d for d in deps if d is not None and d != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_the_checker_sees_the_modules_and_their_imports() -> None:
    assert {"store.core", "store.protocol.append", "store.protocol.read", "coordination.redis", "compactor.gc"} <= set(MODULES)
    assert "store.protocol.append" in _graph()["store.core"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_checker_counts_type_checking_imports_and_imports_of_submodules(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from typing import TYPE_CHECKING\nfrom store.backends import creates\n"
        "if TYPE_CHECKING:\n    from store.core import SessionStore\n"
    )
    found = {_resolve(i) for i in _imported_names("store.sample", sample)}
    assert found == {None, "store.backends.creates", "store.core"}


#: The layers, bottom to top, and the packages each holds (docs/design.md, "Layers"). A module
#: imports from its own layer, the layers below it and ``SHARED``, nothing above.
LAYERS: dict[str, tuple[str, ...]] = {
    "formats": ("store.formats", "store.model", "store.pi"),
    "backends": ("store.backends", "coordination"),
    "protocol": ("store.protocol",),
    "lifecycle": ("store.lifecycle",),
    "facade": ("store",),
    "shells": ("store.cli", "store.http", "store.adapters", "store.streams", "store.demo", "compactor"),
}
#: What a layer may import besides itself and ``SHARED``: formats and backends, side by side at
#: the bottom, know nothing of each other; each layer above knows everything below it.
BELOW: dict[str, set[str]] = {
    "formats": set(),
    "backends": set(),
    "protocol": {"formats", "backends"},
    "lifecycle": {"formats", "backends", "protocol"},
    "facade": {"formats", "backends", "protocol", "lifecycle"},
    "shells": {"formats", "backends", "protocol", "lifecycle", "facade"},
}
#: Imported from anywhere, importing only each other: the error tree, the clock, the fault
#: hooks, the retry policy (``coordination`` applies it too, so it is no backend's), the
#: metrics every layer reports to.
SHARED = {"store.errors", "store.clock", "store.faults", "store.retry", "store.metrics"}


def _layer_of(module: str) -> str | None:
    """The layer of a module: the one whose package holds it (the facade holds ``store`` and
    the modules directly in ``store/``, no subpackage); None for a shared module or a module of
    a package no layer names."""
    if module in SHARED:
        return None
    for layer, packages in LAYERS.items():
        if any(module == p or module.startswith(p + ".") for p in packages if p != "store"):
            return layer
    parts = module.split(".")
    if parts == ["store"] or (len(parts) == 2 and parts[0] == "store"):
        path = MODULES.get(module)
        if path is None or path.parent == ROOT / "store":
            return "facade"
    return None


def _layer_violations(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """``module: [imports of a layer above it, or a shared module importing a layer]``."""
    out: dict[str, list[str]] = {}
    for name, deps in graph.items():
        layer = _layer_of(name)
        allowed = set() if layer is None else {layer} | BELOW[layer]
        wrong = sorted(d for d in deps if d not in SHARED and _layer_of(d) not in allowed)
        if wrong:
            out[name] = wrong
    return out


def test_the_checker_sees_layers_and_imports_upwards() -> None:
    assert _layer_of("store.formats.entries") == "formats" and _layer_of("store.model.js") == "formats"
    assert _layer_of("coordination.redis") == "backends" and _layer_of("store.protocol") == "protocol"
    assert _layer_of("store.core") == "facade" and _layer_of("store") == "facade"
    assert _layer_of("store.streams.service") == "shells" and _layer_of("compactor.gc") == "shells"
    assert _layer_of("store.errors") is None and _layer_of("store.newpackage.x") is None
    graph = {
        "store.formats.a": {"store.formats.b", "store.model.js", "store.errors"},
        "store.formats.b": {"store.backends.objects"},
        "store.backends.objects": {"store.retry", "store.protocol.read"},
        "store.protocol.read": {"store.formats.a", "store.backends.objects", "coordination.redis"},
        "store.lifecycle.sessions": {"store.protocol.read", "store.core"},
        "store.core": {"store.lifecycle.sessions", "store.cli"},
        "store.cli": {"store.core", "compactor.gc", "store.formats.a"},
        "store.errors": {"store.clock", "store.protocol.read"},
    }
    assert _layer_violations(graph) == {
        "store.formats.b": ["store.backends.objects"],
        "store.backends.objects": ["store.protocol.read"],
        "store.lifecycle.sessions": ["store.core"],
        "store.core": ["store.cli"],
        "store.errors": ["store.protocol.read"],
    }


def test_every_module_has_a_layer() -> None:
    """A new package is placed in a layer (``LAYERS``) before its imports can be checked."""
    assert {name: _layer_of(name) for name in MODULES if _layer_of(name) is None} == {
        name: None for name in SHARED
    }
    assert all(LAYERS[layer] for layer in LAYERS) and set(BELOW) == set(LAYERS)


def test_imports_point_down_the_layers() -> None:
    assert _layer_violations(_graph()) == {}


def test_the_store_never_imports_the_compactor() -> None:
    offenders = {
        name: sorted(d for d in deps if d.startswith("compactor"))
        for name, deps in _graph().items()
        if name.startswith("store") and not name.startswith(("store.cli", "store.demo"))
    }
    assert {k: v for k, v in offenders.items() if v} == {}


#: What every adapter shares: how a framework's names map to store session ids. Not an
#: adapter (it imports no framework), so adapters may import it.
ADAPTERS_SHARED = {"store.adapters.names"}


def _adapter_of(module: str) -> str | None:
    """The adapter a module belongs to (``store.adapters.adk.service``: ``store.adapters.adk``),
    None outside the adapters or for what they share. An adapter's own modules import each
    other."""
    parts = module.split(".")
    if parts[:2] != ["store", "adapters"] or len(parts) < 3 or module in ADAPTERS_SHARED:
        return None
    return ".".join(parts[:3])


def test_the_core_never_imports_an_adapter_and_adapters_never_import_each_other() -> None:
    """Front ends (the command line, the HTTP service) may serve an adapter; nothing else
    imports one. Adapters may import what they share (``ADAPTERS_SHARED``), which imports
    no adapter."""
    assert any(name.startswith("store.adapters.") for name in MODULES)
    assert ADAPTERS_SHARED <= set(MODULES)
    offenders = {
        name: sorted(
            d for d in deps
            if d.startswith("store.adapters") and d != "store.adapters"
            and not (d in ADAPTERS_SHARED and name.startswith("store.adapters."))
            and not (_adapter_of(d) is not None and _adapter_of(d) == _adapter_of(name))
        )
        for name, deps in _graph().items()
        if not name.startswith(("store.cli", "store.http"))
    }
    assert {k: v for k, v in offenders.items() if v} == {}
    for shared in ADAPTERS_SHARED:
        assert not [d for d in _graph()[shared] if d.startswith("store.adapters")], shared


def test_coordination_imports_only_the_store_errors_and_retry_policy() -> None:
    allowed = {"store", "store.errors", "store.retry"}
    offenders = {
        name: sorted(d for d in deps if not d.startswith("coordination") and d not in allowed)
        for name, deps in _graph().items()
        if name.startswith("coordination")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_no_import_circles() -> None:
    assert _cycles(_graph()) == []


def _private_imports(path: Path) -> Iterator[str]:
    """Imports of a dependency's private module or name (a component led by one ``_``)."""
    tree = ast.parse(path.read_text())

    def private(dotted: str) -> bool:
        return any(p.startswith("_") and not p.startswith("__") for p in dotted.split("."))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if _resolve(a.name) is None and private(a.name))
        elif isinstance(node, ast.ImportFrom) and not node.level and _resolve(node.module or "") is None:
            module = node.module or ""
            for alias in node.names:
                if private(f"{module}.{alias.name}"):
                    yield f"{module}.{alias.name}"


#: Calls that change the whole interpreter, not just the caller's own objects.
_GLOBAL_SWITCHES = {
    "gc.disable", "gc.enable", "gc.set_threshold", "gc.freeze", "gc.unfreeze", "sys.setswitchinterval",
}


def _global_switches(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and ast.unparse(node.func) in _GLOBAL_SWITCHES:
            yield f"{ast.unparse(node.func)} (line {node.lineno})"


def test_the_checker_sees_private_imports_and_global_switches(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import gc\nimport redis._parsers\nfrom redis._parsers import _RESP2Parser\n"
        "from redis import Redis\nfrom store import errors\ngc.disable()\ngc.collect()\n"
    )
    assert list(_private_imports(sample)) == ["redis._parsers", "redis._parsers._RESP2Parser"]
    assert list(_global_switches(sample)) == ["gc.disable (line 6)"]


#: The one known exception: ADK's own session services split a state delta into its scopes
#: with this helper, and an ADK adapter must split exactly as they do.
_KNOWN_PRIVATE = {"store.adapters.adk.layout": ["google.adk.sessions._session_util"]}


def test_no_private_api_of_a_dependency_and_no_interpreter_wide_switch() -> None:
    found = {
        name: [*_private_imports(path), *_global_switches(path)] for name, path in MODULES.items()
    }
    assert {k: v for k, v in found.items() if v} == _KNOWN_PRIVATE


def _private_names_of_the_facade() -> set[str]:
    """The private attributes of ``SessionStore``: its ``_`` methods and the ``self._x`` it
    sets or reads."""
    tree = ast.parse(MODULES["store.core"].read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SessionStore"]
    names: set[str] = set()
    for node in ast.walk(cls):
        if isinstance(node, ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            names.add(node.attr)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def _reads_of(path: Path, private: set[str]) -> Iterator[str]:
    """``x._name`` for a private name of the facade, on anything but the module's own ``self``."""
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in private
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
        ):
            yield f"{ast.unparse(node)} (line {node.lineno})"


def test_the_checker_sees_reads_of_the_facades_private_attributes(tmp_path: Path) -> None:
    private = _private_names_of_the_facade()
    assert {"_ensure_probed", "_maintenance"} <= private
    sample = tmp_path / "sample.py"
    sample.write_text(
        "def f(store, self):\n    store._ensure_probed()\n    self._maintenance\n"
        "    store.reader\n    worker.store._maintenance\n"
    )
    assert sorted(_reads_of(sample, private)) == [
        "store._ensure_probed (line 2)", "worker.store._maintenance (line 5)",
    ]


def test_no_module_but_the_facade_reads_its_private_attributes() -> None:
    private = _private_names_of_the_facade()
    found = {
        name: list(_reads_of(path, private)) for name, path in MODULES.items() if name != "store.core"
    }
    assert {k: v for k, v in found.items() if v} == {}


#: The longest a module may be, and the one that may be longer: the Lua scripts, each a named
#: constant with its header, read one at a time.
MAX_LINES = 600
LONG_BY_NATURE = {"coordination.scripts"}


def _too_long(modules: dict[str, Path], limit: int) -> dict[str, int]:
    lengths = {name: len(path.read_text().splitlines()) for name, path in modules.items()}
    return {name: n for name, n in sorted(lengths.items()) if n > limit}


def test_the_checker_measures_lengths(tmp_path: Path) -> None:
    short, long = tmp_path / "short.py", tmp_path / "long.py"
    short.write_text("x = 1\n" * 3)
    long.write_text("x = 1\n" * 4)
    assert _too_long({"short": short, "long": long}, 3) == {"long": 4}
    assert len(MODULES["coordination.scripts"].read_text().splitlines()) > MAX_LINES  # what it exempts


def test_no_module_over_600_lines_but_the_lua_scripts() -> None:
    assert LONG_BY_NATURE <= set(MODULES)
    offenders = _too_long({k: v for k, v in MODULES.items() if k not in LONG_BY_NATURE}, MAX_LINES)
    assert offenders == {}, "split by concern: " + ", ".join(f"{k} ({n} lines)" for k, n in offenders.items())
