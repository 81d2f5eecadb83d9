"""Settings are checked at start: a key setting that holds no key, and any number that is not
finite or not in its range, stop the start with one line naming the setting (no traceback), and
docs/operations.md's Knobs table shows the ranges the check holds."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from service.config import Config, SettingError
from service.setting_words import range_text

ROOT = Path(__file__).resolve().parents[2]


def from_env(monkeypatch, **env) -> Config:
    for name in [f.name.upper() for f in fields(Config)]:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return Config.from_env()


@pytest.mark.parametrize("blank", ["", " ", ",", " , ,", "\t"])
def test_a_key_setting_with_no_usable_key_stops_the_start(monkeypatch, blank):
    with pytest.raises(SettingError, match="^API_KEY is set but holds no usable key"):
        from_env(monkeypatch, API_KEY=blank)


def test_no_key_setting_at_all_serves_open_and_keys_are_read_as_before(monkeypatch):
    assert from_env(monkeypatch).api_keys == []
    assert from_env(monkeypatch, API_KEY=" one , two,").api_keys == ["one", "two"]
    with pytest.raises(SettingError, match="API_KEY: a key must be printable ASCII"):
        from_env(monkeypatch, API_KEY="caf\u00e9")


@pytest.mark.parametrize(
    "name, value, words",
    [
        ("REQUEST_TIMEOUT_S", "nan", "a finite number (> 0, <= 86400)"),
        ("REQUEST_TIMEOUT_S", "inf", "a finite number (> 0, <= 86400)"),
        ("REQUEST_TIMEOUT_S", "0", "a finite number (> 0, <= 86400)"),
        ("ENGINE_STALL_S", "nan", "a finite number (> 0, <= 86400)"),
        ("BATCH_WAIT_MS", "-1", "a finite number in 0..60000"),
        ("BATCH_SIZE", "four", "a whole number in 1..256"),
        ("BATCH_SIZE", "0", "a whole number in 1..256"),
        ("MAX_QUEUE", "1.5", "a whole number in 1..1000000"),
        ("VLLM_GPU_MEMORY_UTILIZATION", "1.5", "a finite number (> 0, <= 1)"),
        ("VLLM_KV_CACHE_GIB", "0", "a finite number (> 0, <= 4096)"),
        ("PORT", "70000", "a whole number in 1..65535"),
        ("GRACEFUL_TIMEOUT", "-5", "a whole number in 1..86400"),
        ("REPLICAS", "0", "a whole number in 1..256"),
        ("VLLM_ENABLED", "maybe", "a flag"),
    ],
)
def test_a_setting_out_of_its_range_is_one_line_naming_it(monkeypatch, name, value, words):
    with pytest.raises(SettingError) as refused:
        from_env(monkeypatch, **{name: value})
    message = str(refused.value)
    assert message.startswith(f"{name} must be {words}") and repr(value) in message, message
    assert "\n" not in message


def test_every_bad_setting_is_named_at_once(monkeypatch):
    with pytest.raises(SettingError) as refused:
        from_env(monkeypatch, BATCH_SIZE="0", PORT="0")
    assert str(refused.value).count("must be") == 2


def bad_start(command: list[str], **env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in {f.name.upper() for f in fields(Config)}}
    return subprocess.run(command, cwd=ROOT, env={**clean, **env}, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    "command",
    [
        [sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py", "wsgi:app"],
        [sys.executable, "-m", "deploy.cluster", "render"],
    ],
    ids=["gunicorn", "cluster"],
)
@pytest.mark.parametrize("env", [{"REQUEST_TIMEOUT_S": "nan"}, {"API_KEY": " "}], ids=["nan", "blank key"])
def test_gunicorn_and_the_cluster_refuse_to_start_in_one_line(command, env):
    """Plain gunicorn (its master reads the settings: nothing loads) and deploy/cluster.py, which
    `make serve` and `make cluster` run."""
    done = bad_start(command, **env)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr
    name = next(iter(env))
    lines = [line for line in done.stderr.splitlines() if name in line]
    assert len(lines) == 1 and "not starting" in lines[0], done.stderr


def knobs_table() -> dict[str, str]:
    """docs/operations.md's Knobs table: each variable it names -> its range cell."""
    text = (ROOT / "docs" / "operations.md").read_text()
    table = text.split("| variable | default | range | meaning |", 1)[1].split("\n\n", 1)[0]
    ranges = {}
    for row in table.strip().splitlines()[1:]:
        cells = [cell.strip() for cell in row.strip("|").split(" | ")]
        for name in re.findall(r"`([A-Z_0-9]+)`", cells[0]):
            ranges[name] = cells[2]
    return ranges


def test_the_docs_show_the_ranges_the_check_holds():
    table = knobs_table()
    for f in fields(Config):
        name, span = f.name.upper(), range_text(Config, f.name)
        assert name in table, f"{name} is missing from docs/operations.md's Knobs table"
        if span:
            assert table[name] == f"`{span}`", f"{name}: the docs say {table[name]!r}, the check holds {span!r}"
