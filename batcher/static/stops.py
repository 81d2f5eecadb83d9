"""Stop strings on decoded text: where one first ends, and how much of a stream to hold back.

Hand-written rather than taken from vLLM (its `check_stop_strings` is internal API that moves
between releases); the rule is the same: the stop string that completes earliest wins, ties go
to list order, and the returned text ends where the stop string begins.
"""

from __future__ import annotations


def find_stop(text: str, stops: tuple[str, ...], new_from: int) -> int | None:
    """Index where the earliest-ending stop string begins, among those that end after `new_from`
    (text before it was searched already), or None."""
    best_end, best_start = None, None
    for stop in stops:
        start = text.find(stop, max(0, new_from - len(stop) + 1))
        if start != -1 and (best_end is None or start + len(stop) < best_end):
            best_end, best_start = start + len(stop), start
    return best_start


def held_back(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest tail of `text` that could still grow into a stop string: a stream
    sends everything before it and keeps the tail until the next token decides."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:size]):
                longest = size
                break
    return longest
