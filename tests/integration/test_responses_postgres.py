"""The stored responses on a real PostgreSQL (tests/helpers/postgres.py starts one; skipped,
saying why, where it cannot): every test of tests/unit/test_response_store.py again, each on a
database of its own, so that replicas sharing one server read, continue and take over each
other's responses as the tests on SQLite show."""

from __future__ import annotations

import inspect

import pytest

from service.jobs import tables
from service.openai.responses.stored import ResponseStore
from tests.helpers.postgres import database, postgres_server
from tests.unit import test_response_store as on_sqlite
from tests.unit.test_response_store import DAY, Clock


@pytest.fixture(scope="module")
def server():
    with postgres_server() as address:
        yield address


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def store(server, clock):
    with database(server) as url:
        made = ResponseStore(tables.connect(url), retention_s=30 * DAY, clock=clock)
        yield made
        made.db.dispose()


# every test of the SQLite module that takes a `store`, run here on this module's
globals().update(
    {
        name: test
        for name, test in vars(on_sqlite).items()
        if name.startswith("test_") and "store" in inspect.signature(test).parameters
    }
)
