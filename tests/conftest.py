"""What the three tiers share: the model's path, and how `make test` spreads the tests over
pytest-xdist's workers. Each tier has a conftest.py of its own: tests/unit (no model, no server),
tests/integration (the app and the runner in this process), tests/e2e (a real gunicorn). Plain
helpers are in tests/helpers/, imported by name. xdist's controller loads this file alone before
any worker starts: it imports no torch."""

from __future__ import annotations

import pytest

from batcher.checkpoint import resolve_model
from service.config import Config


@pytest.fixture(scope="session")
def model_path() -> str:
    defaults = Config()
    return resolve_model(defaults.model, defaults.cache_dir)


# --- pytest-xdist: what goes to which worker, and in what order ----------------------------------
# What shares an expensive fixture runs in one worker: the first of SHARED_FIXTURES a test uses
# names its group (the fixture names whose instance costs an engine start or more), else its
# module does (a module's own module-scoped server then starts once). The groups go out longest
# first (LPT), so that no long group starts while the other worker runs out of work (the rolling
# restart once ran last, alone, for 280 s; `served`'s group, priced at its old modules' seconds,
# once left one worker 184 s after the other): COST_S holds each module's seconds (every test and
# fixture of it, summed over both workers) from a quiet run on a warm tree on the AMD EPYC (Zen 4)
# here, 2026-12-03; only the order depends on them, and a module not named counts 1 s a test.
# `make test` passes --no-loadscope-reorder, since xdist would otherwise send the groups with the
# most tests first, whatever they cost.
SHARED_FIXTURES = ("shared_server", "app", "runner_fp32", "static_server", "served")
COST_S = {
    "test_cluster": 180, "test_tools": 130, "test_eval": 126, "test_structured": 103, "test_sampling": 95,
    "test_profile": 72, "test_openai": 71, "test_static_compile": 67, "test_slow_clients": 46, "test_fuzz": 33,
    "test_overload": 50, "test_isolation": 30, "test_page": 29, "test_bench_smoke": 28, "test_drain": 27,
    "test_admission": 23, "test_runner": 20, "test_openai_fields": 18, "test_streaming": 16, "test_echo": 14,
    "test_vllm": 10, "test_api": 10, "test_worker": 9, "test_context": 8, "test_e2e": 7, "test_race": 5,
    "test_kubernetes": 5, "test_hosts": 230, "test_crash_only": 50, "test_request_bounds": 15, "test_recovery": 2,
}  # fmt: skip


def _costs(items: list) -> dict:
    """Each test's estimated seconds: its module's COST_S shared evenly by the module's tests."""
    name = {item: item.module.__name__.rpartition(".")[2] for item in items}
    count: dict[str, int] = {}
    for item in items:
        count[name[item]] = count.get(name[item], 0) + 1
    return {item: COST_S.get(name[item], count[name[item]]) / count[name[item]] for item in items}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Groups the tests and orders the groups longest first (stably: pytest-randomly's order stays
    within each group). The group is xdist's own `xdist_group` mark, added here, before
    pytest-xdist's hook reads it (hence tryfirst) and writes it into the node id that
    `--dist loadgroup` schedules by; that works on pytest 9.1, not 9.2 (requirements-dev.txt)."""
    costs, group, total = _costs(items), {}, {}
    for item in items:
        names = item.fixturenames  # the whole closure: a fixture's own fixtures too
        group[item] = next((name for name in SHARED_FIXTURES if name in names), item.module.__name__)
        total[group[item]] = total.get(group[item], 0.0) + costs[item]
    # a group's tests stay together; one marked `last` (it stops the group's server) goes after the rest
    items.sort(key=lambda item: (-total[group[item]], group[item], item.get_closest_marker("last") is not None))
    for item in items:
        item.add_marker(pytest.mark.xdist_group(group[item]))
