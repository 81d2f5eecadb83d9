"""The layout of service/ (docs/design.md): a folder per API, whose routes no sibling imports;
helpers that take what they need as arguments, never from Flask's globals; request models that
depend on no route."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit  # no model, no server: `make check` runs it

SERVICE = Path(__file__).resolve().parents[2] / "service"
MODULES = sorted(SERVICE.rglob("*.py"))
GLOBALS = {"current_app", "g"}


def name(path: Path) -> str:
    parts = path.relative_to(SERVICE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def imports(module: ast.Module) -> list[tuple[str, list[str]]]:
    """(module, names) of every `from service... import names` and `import service...`, but those
    under `if TYPE_CHECKING:` (a name for the type checker is no dependency at run time)."""
    found, typing_only = [], set()
    for node in ast.walk(module):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            typing_only |= {id(n) for n in ast.walk(node)}
    for node in ast.walk(module):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names]
    return found


def defines_routes(module: ast.Module) -> bool:
    """A module of routes makes a Blueprint."""
    return any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == "Blueprint" for n in ast.walk(module))


ROUTES = {name(p) for p in MODULES if defines_routes(tree(p))}


def test_the_walk_sees_the_routes():
    assert {"service.openai.routes", "service.demo.routes", "service.ops.routes"} <= ROUTES
    assert "service.generation" not in ROUTES


@pytest.mark.parametrize("path", MODULES, ids=name)
def test_only_views_and_the_http_layer_read_flasks_globals(path):
    """A helper takes config, tokenizer and engines as arguments (service/http/lookup.py is where
    a view finds them), so that its test needs no app."""
    module, own = tree(path), name(path)
    if own in ROUTES or own == "service" or own.startswith("service.http"):
        return
    used = {n for mod, names in imports(module) if mod == "flask" for n in names} & GLOBALS
    assert used == set(), f"{own} reads {used}"


@pytest.mark.parametrize("path", MODULES, ids=name)
def test_no_folder_imports_a_siblings_routes(path):
    """Only the app factory (service/__init__.py) registers every folder's routes."""
    own = name(path)
    if own == "service":
        return
    folder = own.rsplit(".", 1)[0] if path.name != "__init__.py" else own
    for mod, names in imports(tree(path)):
        targets = {mod} | {f"{mod}.{n}" for n in names}
        for target in targets & ROUTES:
            assert target.rsplit(".", 1)[0] == folder, f"{own} imports {target}"


@pytest.mark.parametrize("path", sorted((SERVICE / "protocol").glob("*.py")), ids=name)
def test_the_request_models_depend_on_no_route_and_no_http(path):
    for mod, _ in imports(tree(path)):
        assert not mod.startswith(("service.http", "service.openai", "service.demo", "service.ops", "flask")), mod
