"""What the three tiers share: the model's path, and how `make test` spreads the tests over
pytest-xdist's workers. Each tier has a conftest.py of its own: tests/unit (no model, no server),
tests/integration (the app and the runner in this process), tests/e2e (a real gunicorn). Plain
helpers are in tests/helpers/, imported by name. xdist's controller loads this file alone before
any worker starts.

Here, before any test module or tier's conftest imports transformers (which reads Inductor's
config), torch is imported first and the compile caches' settings are made, as the service and its
children do: both are part of Inductor's cache keys (batcher/compile_cache.py), so a graph a child
process builds is the one a test's app in this process loads (the controller pays a second for it)."""

from __future__ import annotations

from batcher.compile_cache import import_torch_first, use_compile_cache

import_torch_first()
from batcher.device import pick_device  # noqa: E402  (imports torch)

use_compile_cache("", pick_device("auto"))  # the folders as the environment gives; the settings that key graphs

import pytest  # noqa: E402

from batcher.checkpoint import resolve_model  # noqa: E402
from service.config import Config  # noqa: E402


@pytest.fixture(scope="session")
def model_path() -> str:
    defaults = Config()
    return resolve_model(defaults.model, defaults.cache_dir)


# --- pytest-xdist: what goes to which worker, and in what order ----------------------------------
# What shares an expensive fixture runs in one worker: the first of SHARED_FIXTURES a test uses
# (its whole closure) names its group, else its module does (a module's own module-scoped server
# then starts once). xdist sends a worker the next group when it is nearly out of work, in the
# order of the items here (`make test` passes --no-loadscope-reorder, since xdist would otherwise
# send the groups with the most tests first, whatever they cost), so the longest go first and the
# short ones even out the end: no long group may start while the other worker runs dry (the rolling
# restart once ran last, alone, for 280 s). The rule, not a table of seconds to keep measured:
# tier first, e2e (servers start: a minute or more each), then integration (the model in this
# process), then unit (seconds); within a tier, the shared fixtures' groups in SHARED_FIXTURES'
# order, which lists each tier's by size (on the AMD EPYC Zen 4 here, 2026-12-03: the shared
# gunicorn's chain ~270 s, `make serve`'s ~175 s, static_server's ~60 s; the in-process app's
# ~145 s, the runner's ~100 s), then each module's own group, most tests first.
SHARED_FIXTURES = ("shared_server", "served", "static_server", "app", "runner_fp32")
TIERS = ("e2e", "integration", "unit")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Groups the tests and orders the groups (stably: pytest-randomly's order stays within each
    group). The group is xdist's own `xdist_group` mark, added here, before pytest-xdist's hook
    reads it (hence tryfirst) and writes it into the node id that `--dist loadgroup` schedules by;
    that works on pytest 9.1, not 9.2 (requirements-dev.txt)."""
    group, rank, count = {}, {}, {}
    for item in items:
        names = item.fixturenames  # the whole closure: a fixture's own fixtures too
        shared = next((name for name in SHARED_FIXTURES if name in names), None)
        group[item] = shared or item.module.__name__
        tier = item.module.__name__.split(".")[1]  # tests.<tier>.test_x
        if tier not in TIERS:
            raise pytest.UsageError(f"{item.nodeid}: test modules live in tests/unit, tests/integration or tests/e2e")
        rank[group[item]] = (TIERS.index(tier), SHARED_FIXTURES.index(shared) if shared else len(SHARED_FIXTURES))
        count[group[item]] = count.get(group[item], 0) + 1
    # a group's tests stay together; one marked `last` (it stops the group's server) goes after the rest
    items.sort(key=lambda item: (*rank[group[item]], -count[group[item]], group[item], _last(item)))
    for item in items:
        item.add_marker(pytest.mark.xdist_group(group[item]))


def _last(item) -> bool:
    return item.get_closest_marker("last") is not None
