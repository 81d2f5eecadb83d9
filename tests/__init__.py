"""The test suite. `make test` runs it on pytest-xdist, one worker per core (tests/conftest.py
keeps whatever shares an expensive fixture in one worker), and each worker pins itself to its own
core here, the first module a worker imports, before anything loads torch: torch's intra-op
threads, the static engine's `set_torch_threads`, vLLM's OpenMP binding and every server a worker
starts then follow that one core. Unpinned, two workers' torch threads would spin at every op's
barrier on the same two cores (an oversubscribed CPU once made a static decode step 7 s against
0.3 s with one thread: docs/performance.md); pinned, one worker's model work overlaps what the
other does one thread at a time (imports, engine start-ups, lm-eval, HTTP)."""

import os


def _pin_to_one_core() -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, ... under xdist; unset without
    if worker.startswith("gw"):
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[int(worker[2:]) % len(cores)]})


_pin_to_one_core()
