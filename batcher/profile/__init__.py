"""The machine profile: what `make setup` measured on this machine, and what each `auto` becomes.

store.py: the key (what changes the answer: the CPU, torch and vLLM, the model file) and the
JSON under `.cache/profile/`; choose.py: the rule (faithful first, then fastest), a pure
function; measure.py: the candidates in the order of what can win, within a budget; session.py:
one child process per engine for all its candidates, each under its cap; child.py: one engine
alone in its process (the profile's runs and the bench's baselines); candidate.py: one
candidate in the child (fidelity first, speed only if faithful, stopped on its projection);
fidelity.py: the agreement with the reference and when the bar is out of reach; `python -m
batcher.profile` prints the table and the choice, `--measure` measures again.
"""
