"""The docs and the layer rule, checked without a model or a server: every relative link in the
README and docs/ names a file that exists, the README stays short, and batcher/ never imports
service/ (settings come down to the engines as frozen slices, never up from the HTTP layer)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 250

# [text](target) and ![alt](target); the target ends at whitespace or ")" (an optional "title"
# after it is not part of the path). Code spans and fenced blocks are removed first: a bracket
# followed by a parenthesis inside code (`a[i](x)`) is not a link.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto: ...


def relative_links(text: str) -> list[str]:
    """The path part of every relative link in a markdown text (anchors dropped, "#x" skipped)."""
    prose = CODE_SPAN.sub("", FENCE.sub("", text))
    paths = []
    for target in LINK.findall(prose):
        if EXTERNAL.match(target):
            continue
        path = target.split("#", 1)[0].split("?", 1)[0]
        if path:
            paths.append(path)
    return paths


def broken_links(page: Path) -> list[str]:
    return [p for p in relative_links(page.read_text()) if not (page.parent / p).resolve().exists()]


def service_imports(source: str) -> list[str]:
    """Every import of service (or service.x) in a module, at any depth: inside functions too."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] == "service"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] == "service":
                found.append(node.module)
    return found


def test_pages_exist():
    names = {p.name for p in PAGES}
    for page in ("api.md", "openai.md", "operations.md", "design.md", "performance.md", "testing.md"):
        assert page in names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    assert broken_links(page) == []


def test_readme_is_short():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


def test_batcher_never_imports_service():
    modules = sorted((ROOT / "batcher").rglob("*.py"))
    assert len(modules) > 10  # the walk found the package
    offenders = {str(m.relative_to(ROOT)): service_imports(m.read_text()) for m in modules}
    assert {m: names for m, names in offenders.items() if names} == {}


def test_link_parser_finds_what_it_must(tmp_path):
    """The checks can fail: a missing file is reported, anchors and externals are not paths."""
    (tmp_path / "there.md").write_text("x")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](there.md) [anchor](there.md#a-b) [self](#top) [web](https://example.com/x.md)\n"
        "![img](missing.png) [gone](nowhere/file.md#x) `[code](skipped.md)`\n"
        "```\n[fenced](skipped_too.md)\n```\n"
    )
    assert broken_links(page) == ["missing.png", "nowhere/file.md"]


def test_import_check_sees_function_level_imports():
    source = (
        "import os\nfrom batcher import engine\nfrom . import service\n"
        "def f():\n    from service.config import Config\n    import service.errors as e\n"
    )
    assert service_imports(source) == ["service.config", "service.errors"]
