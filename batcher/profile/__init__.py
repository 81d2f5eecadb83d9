"""The machine profile: what `make setup` measured on this machine, and what each `auto` becomes.

store.py: the key (what changes the answer: the CPU, torch and vLLM, the model file) and the
JSON under `.cache/profile/`; choose.py: the rule (faithful first, then fastest), a pure
function; measure.py: the candidates, each in its own process, within a budget; child.py: one
engine alone in its process (the profile's runs and the bench's baselines); `python -m
batcher.profile` prints the table and the choice, `--measure` measures again.
"""
