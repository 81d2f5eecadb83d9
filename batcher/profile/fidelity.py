"""Agreement with the reference (the static engine's fp32 eager completions): the bar, and when a
candidate can no longer reach it, so that the child stops there instead of finishing its prompts.

The fidelity prompts are the 20 prompts of prompts.json, greedy, MAX_TOKENS tokens each, through
the model's chat template, or as plain completions for a model without one (`prompt_texts`);
France -> Paris is the first of them, so a candidate that gets France wrong stops after its first
chunk. Pure functions (tests/integration/test_profile.py feeds them fake token lists).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

PROMPTS = json.loads(Path(__file__).with_name("prompts.json").read_text())
PARIS_PROMPT = "What is the capital of France?"
PARIS_INDEX = PROMPTS.index(PARIS_PROMPT)
MAX_TOKENS = 24
MIN_PREFIX = 0.95  # the mean agreeing prefix a faithful candidate reaches (choose.py reads it)


FORMS = {"chat": "through the chat template", "completion": "plain completions (the model has no chat template)"}


def prompt_texts(tok) -> tuple[list[str], str]:
    """The prompts as the model reads them, and how (a key of FORMS): through its chat template,
    or, for a model without one (a base model such as the write-up's facebook/opt-125m, which the
    service serves through /completions alone), as plain completions: the question, then "Answer:"."""
    if not getattr(tok, "chat_template", None):
        return [f"Question: {p}\nAnswer:" for p in PROMPTS], "completion"
    chat = [[{"role": "user", "content": p}] for p in PROMPTS]
    return [tok.apply_chat_template(turn, tokenize=False, add_generation_prompt=True) for turn in chat], "chat"


def france_right(paris: str, reference_paris: str | None = None) -> bool:
    """Paris in the answer. A reference (fp32) that does not say Paris itself (a small base model,
    random weights) sets no France bar: agreeing with it is all there is to judge."""
    return "Paris" in paris or (reference_paris is not None and "Paris" not in reference_paris)


def agreeing_prefix(a: list[int], b: list[int]) -> float:
    """Tokens agreeing from the start over the longer of the two."""
    same = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return same / max(len(a), len(b)) if a or b else 1.0


def compare(
    reference: list[list[int]], completions: list[list[int]], paris: str, reference_paris: str | None = None
) -> dict:
    """Exact matches and the mean agreeing prefix over the completions so far (the first
    len(completions) prompts), France -> Paris (`paris`: the decoded answer to PARIS_PROMPT;
    `reference_paris`: the reference's, see france_right)."""
    pairs = list(zip(reference, completions, strict=False))
    return {
        "exact": sum(a == b for a, b in pairs),
        "of": len(pairs),
        "prefix": round(statistics.mean(agreeing_prefix(a, b) for a, b in pairs), 3),
        "france": france_right(paris, reference_paris),
        "france_bar": reference_paris is None or "Paris" in reference_paris,  # False: no bar to judge
        "france_text": paris[:40].replace("\n", " "),
    }


def out_of_reach(reference: list[list[int]], completions: list[list[int]], france: bool) -> str | None:
    """Why the bar cannot be met whatever the prompts not yet run answer (each at best a full
    agreement), or None while it still can: France wrong, or the best mean prefix under MIN_PREFIX."""
    done = len(completions)
    if not france:
        return f"not faithful: France wrong after {done}/{len(reference)} prompts"
    seen = sum(agreeing_prefix(a, b) for a, b in zip(reference, completions, strict=False))
    best = (seen + len(reference) - done) / len(reference)
    if best < MIN_PREFIX:
        return f"not faithful: agreeing prefix at most {best:.2f} after {done}/{len(reference)} prompts"
    return None
