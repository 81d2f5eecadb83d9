"""lm-eval's own command line (`lm_eval._cli.HarnessCLI`, what `python -m lm_eval` runs), once per
argument list, all in one process, indexing only the tasks of `--include_path`:

    python -m tests.e2e.eval.harness ARGS... [--next ARGS...]...

Each `python -m lm_eval` pays twice before its first request: ~4 s of imports, and its TaskManager
indexing the ~14,000 YAML files of lm-eval's own tasks (25 s on a busy 2-core machine, measured
2026-12-02), whatever `--tasks` asks for. tests/e2e/test_eval.py runs `python -m lm_eval` itself once,
as docs/openai.md gives it, so that what a user runs is tested with both costs; its other runs go
through this, which pays the imports once and indexes ours alone (`include_defaults=False`, the
TaskManager's own switch): the same CLI code parses the same arguments and runs the same tasks.
"""

from __future__ import annotations

import sys

import lm_eval.tasks
from lm_eval._cli import HarnessCLI
from lm_eval.utils import setup_logging


class OursOnly(lm_eval.tasks.TaskManager):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{**kwargs, "include_defaults": False})


def main(argv: list[str]) -> int:
    setup_logging()
    # EvaluatorConfig.process_tasks imports TaskManager from lm_eval.tasks when it runs
    lm_eval.tasks.TaskManager = OursOnly
    runs, current = [], []
    for arg in argv:
        if arg == "--next":
            runs.append(current)
            current = []
        else:
            current.append(arg)
    runs.append(current)
    for args in runs:
        sys.argv = ["lm-eval", *args]  # HarnessCLI reads sys.argv, as `python -m lm_eval` does
        cli = HarnessCLI()
        cli.execute(cli.parse_args())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
