"""lm-eval's own command line (`lm_eval._cli.HarnessCLI`, what `python -m lm_eval` runs), once per
argument list, all in one process: each lm-eval process spends about 20 s importing before it
indexes its tasks, so tests/test_eval.py runs `python -m lm_eval` itself once, as the README gives
it, and its other runs through this.

    python -m tests.eval.harness ARGS... [--next ARGS...]...
"""

from __future__ import annotations

import sys

from lm_eval._cli import HarnessCLI
from lm_eval.utils import setup_logging


def main(argv: list[str]) -> int:
    setup_logging()
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
