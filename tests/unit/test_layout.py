"""The layout (docs/design.md): a folder per API, whose routes no sibling imports; helpers that
take what they need as arguments, never from Flask's globals; request models that depend on
nothing of the serving side; a running service that needs nothing of deploy/ or bench/; and no
file past 250 lines."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit  # no model, no server: `make check` runs it

ROOT = Path(__file__).resolve().parents[2]
SERVICE = ROOT / "service"
MODULES = sorted(SERVICE.rglob("*.py"))
MAX_LINES = 250
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


def defines_routes(path: Path) -> bool:
    """A module of routes is an API's routes.py, or makes a Blueprint."""
    calls = (n for n in ast.walk(tree(path)) if isinstance(n, ast.Call))
    return path.name == "routes.py" or any(getattr(n.func, "id", None) == "Blueprint" for n in calls)


ROUTES = {name(p) for p in MODULES if defines_routes(p)}


def test_the_walk_sees_the_routes():
    expected = {"service.openai.chat.routes", "service.openai.router", "service.demo.routes", "service.ops.routes"}
    assert expected <= ROUTES
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
    """Only the app factory (service/__init__.py) registers every folder's routes, and a folder
    those of the folders below it (service/openai/router.py)."""
    own = name(path)
    if own == "service":
        return
    folder = own.rsplit(".", 1)[0] if path.name != "__init__.py" else own
    for mod, names in imports(tree(path)):
        targets = {mod} | {f"{mod}.{n}" for n in names}
        for target in targets & ROUTES:
            assert f"{target.rsplit('.', 1)[0]}.".startswith(f"{folder}."), f"{own} imports {target}"


PROTOCOLS = sorted([*(SERVICE / "protocol").glob("*.py"), *SERVICE.rglob("protocol.py")])
SERVING = ("routes", "router", "serving", "shape", "events", "template", "echo", "fields")


@pytest.mark.parametrize("path", PROTOCOLS, ids=name)
def test_the_request_models_import_nothing_of_the_serving_side(path):
    """A protocol.py holds request models: validation and `to_sampling_params`, no plan, no reply."""
    for mod, names in imports(tree(path)):
        assert not mod.startswith(("service.http", "service.ops", "service.generation", "service.plan", "flask")), mod
        for target in {mod} | {f"{mod}.{n}" for n in names}:
            assert target.rsplit(".", 1)[-1] not in SERVING, f"{name(path)} imports {target}"


RUNNING = sorted([*SERVICE.rglob("*.py"), *(ROOT / "batcher").rglob("*.py"), ROOT / "wsgi.py"])


@pytest.mark.parametrize("path", RUNNING, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_running_service_imports_nothing_of_deploy_or_bench(path):
    for mod, _ in imports(tree(path)):
        assert mod.split(".")[0] not in ("deploy", "bench"), f"{path.relative_to(ROOT)} imports {mod}"


CODE = sorted(p for folder in ("service", "batcher", "bench", "deploy") for p in (ROOT / folder).rglob("*.py"))


@pytest.mark.parametrize("path", CODE, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_file_is_past_250_lines(path):
    """Past it, a file holds more than one idea: split it by concept (docs/design.md)."""
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)}: {lines} lines"
