"""The one-way import rules (app/README.md, docs/architecture.md), read from the source with `ast`:
data flows deployments -> app/api -> app/engine, app/tools -> app/speculation and the shared
modules below them; nothing imports what is above it, no package imports itself in a circle,
and no product code edits `sys.path`. Imports under `if TYPE_CHECKING:` are left out (they
never run)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("app", "deployments")
# Modules under app/ that every layer may import: they import none of the layers above.
SHARED = ("app.config", "app.telemetry", "app.cpu_budget", "app.check_pool", "app.openai_models",
          "app.vllm_names", "app.output_format", "app.tenancy", "app.home", "app.faults",
          "app.datasets")
ABOVE_ALL = ("app.api", "app.tools", "app.distill", "deployments", "app.cli")
# The engine rooms, lowest first: each may import the rooms before it, never one after it
# (app/README.md): how models write, drafting, the engines and their platform, then the two
# services built on an engine (neither imports the other).
ROOMS = ("app.formats", "app.drafting", "app.engine", "app.sidecar", "app.main_model")
SERVICES = ("app.sidecar", "app.main_model")
# Layer -> prefixes it must never import.
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "app.speculation": (*ABOVE_ALL, *ROOMS),
    **{room: (*ABOVE_ALL, *ROOMS[i + 1:]) for i, room in enumerate(ROOMS) if room not in SERVICES},
    **{service: (*ABOVE_ALL, *(s for s in SERVICES if s != service)) for service in SERVICES},
    "app.tools": (*ABOVE_ALL[:1], *ABOVE_ALL[2:], *ROOMS),
    "app.api": ("deployments", "app.distill", "app.cli"),
    **{shared: (*ABOVE_ALL, *ROOMS)
       for shared in SHARED if shared not in ("app.telemetry", "app.faults")},
    # The metric catalogue and fault plans know the turn's types (for type checking only).
    "app.telemetry": (*ABOVE_ALL, *ROOMS),
    "app.faults": (*ABOVE_ALL, *ROOMS),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def product_files() -> list[Path]:
    return sorted(p for top in PRODUCT for p in (ROOT / top).rglob("*.py"))


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node, except the bodies of `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking_only(child):
                stack.extend(child.orelse)
                continue
            stack.append(child)


def imports_of(path: Path) -> set[str]:
    """Modules `path` imports at run time (module level or inside functions), absolute."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    return imports_in(path.read_text(encoding="utf-8"), package)


def imports_in(source: str, package: str) -> set[str]:
    found: set[str] = set()
    for node in _runtime_nodes(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            # `from app.engine import sidecar` imports the submodule app.sidecar.service.
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def edits_sys_path(path: Path) -> bool:
    """Whether the module touches `sys.path` at all (under any name it gives `sys`)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = {"sys"} | {alias.asname for node in ast.walk(tree) if isinstance(node, ast.Import)
                       for alias in node.names if alias.name == "sys" and alias.asname}
    return any(
        (isinstance(node, ast.Attribute) and node.attr == "path"
         and isinstance(node.value, ast.Name) and node.value.id in names)
        or (isinstance(node, ast.ImportFrom) and node.module == "sys"
            and any(alias.name == "path" for alias in node.names))
        for node in ast.walk(tree))


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for module, imported in sorted(graph.items()):
        for layer, forbidden in FORBIDDEN.items():
            if not _within(module, layer):
                continue
            out += [f"{module} imports {name}" for name in sorted(imported)
                    if any(_within(name, f) for f in forbidden)]
        if _within(module, "app") and module != "app.cli":
            out += [f"{module} imports {name}" for name in sorted(imported)
                    if _within(name, "deployments")]
    return out


def module_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Import circles among all the modules of `graph`, across packages too: each strongly
    connected component of more than one module (Tarjan's algorithm), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for name in sorted(graph.get(node, ())):
            if name not in graph or name == node:
                continue
            if name not in index:
                visit(name)
                low[node] = min(low[node], low[name])
            elif name in on_stack:
                low[node] = min(low[node], index[name])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for start in sorted(graph):
        if start not in index:
            visit(start)
    return sorted(found)


def import_graph() -> dict[str, set[str]]:
    return {module_name(p): imports_of(p) for p in product_files()}


def test_layers_import_only_downwards() -> None:
    assert layer_violations(import_graph()) == []


def test_the_tools_never_import_the_engine() -> None:
    graph = import_graph()
    assert [(m, n) for m, names in graph.items() if _within(m, "app.tools")
            for n in names if _within(n, "app.engine")] == []


def test_no_product_code_edits_sys_path() -> None:
    assert [str(p.relative_to(ROOT)) for p in product_files() if edits_sys_path(p)] == []


def test_no_import_circle_anywhere() -> None:
    """No module reaches itself through its imports, within a package or across packages (a
    package's `__init__` counts as a module, so importing a package counts too)."""
    graph = {module_name(p): imports_of(p)
             for top in (*PRODUCT, "load_tests") for p in (ROOT / top).rglob("*.py")}
    assert module_cycles(graph) == []


def test_the_product_never_imports_its_benchmark() -> None:
    """The datasets the product reads are its own (app/datasets/); load_tests/ imports them."""
    assert [(m, n) for m, names in import_graph().items() for n in names
            if _within(n, "load_tests")] == []


def test_the_checks_see_a_violation(tmp_path: Path) -> None:
    """The readers themselves: a tools module importing the engine (also lazily, inside a
    function), a sys.path edit."""
    lazy = "def f():\n    from app.engine.embedded_model import model_home\n"
    graph = {"app.tools.x": imports_in(lazy, "app.tools")}
    assert layer_violations(graph) == [
        "app.tools.x imports app.engine.embedded_model",
        "app.tools.x imports app.engine.embedded_model.model_home"]
    typed = "if TYPE_CHECKING:\n    from app.speculation.turn import TurnResult\n"
    assert layer_violations({"app.tools.x": imports_in(typed, "app.tools")}) == []
    for edit in ("import sys\nsys.path.insert(0, '.')\n", "import sys as s\ns.path.append('.')\n",
                 "from sys import path\npath.append('.')\n"):
        file = tmp_path / "mod.py"
        file.write_text(edit)
        assert edits_sys_path(file), edit


def test_shared_names_come_from_their_own_module() -> None:
    """One home per concept: the tenant names from app/tenancy.py, the cache folder from
    app/home.py, never through a module that merely imports them."""
    homes = {"ANONYMOUS_TENANT": "app.tenancy", "TENANT_KEY": "app.tenancy",
             "model_home": "app.home"}
    found = []
    for path in [*product_files(), *(ROOT / "load_tests").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                found += [f"{module_name(path)}: {alias.name} from {node.module}"
                          for alias in node.names
                          if alias.name in homes and node.module != homes[alias.name]]
    assert found == []


def test_a_circle_is_found() -> None:
    graph = {"app.distill.train": {"app.distill.ray_job"},
             "app.distill.ray_job": {"app.distill.train"},
             "app.distill.pairs": set()}
    assert module_cycles(graph) == [["app.distill.ray_job", "app.distill.train"]]
    across = {"app.engine.engine_args": {"app.engine.cuda_driver"},
              "app.engine.cuda_driver": {"app.config"},
              "app.config": {"app.engine.engine_args.Platform", "app.engine.engine_args"}}
    assert module_cycles(across) == [["app.config", "app.engine.cuda_driver",
                                      "app.engine.engine_args"]]


# No room of app/ holds more than about a fifth of the product (issue: the engine room had 28%).
MAX_ROOM_SHARE = 0.22


def room_sizes() -> dict[str, int]:
    """Lines per folder of app/ (its modules at the top count as `app`) and deployments/."""
    sizes: dict[str, int] = {}
    for path in product_files():
        parts = path.relative_to(ROOT).parts
        room = "/".join(parts[:2]) if parts[0] == "app" and len(parts) > 2 else parts[0]
        sizes[room] = sizes.get(room, 0) + len(path.read_text(encoding="utf-8").splitlines())
    return sizes


def test_no_room_holds_more_than_a_fifth_of_the_product() -> None:
    sizes = room_sizes()
    total = sum(sizes.values())
    assert {room: round(n / total, 3) for room, n in sizes.items()
            if n / total > MAX_ROOM_SHARE} == {}
    assert len([room for room in sizes if room.startswith("app/")]) >= 10
