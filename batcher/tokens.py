"""What an engine hands back per token: its logprob record, and the streamed pieces of text."""

from __future__ import annotations

from dataclasses import dataclass

LOGPROB_FLOOR = -9999.0  # vLLM's OpenAI server: the logprob it reports for an impossible token


@dataclass(frozen=True)
class TokenLogprob:
    """One token's log-probability under the model (before temperature, penalties and filters,
    as vLLM reports by default) and the `logprobs` most likely tokens at that step, most likely
    first, each as (token id, token text, logprob). A generated token's, or a prompt token's
    (`Sequence.prompt_logprobs`): the prompt's first token has no context to be predicted from,
    so its `logprob` is None, as vLLM's. `rank`: the token's place in the step's distribution
    (1: the most likely), where the engine reports it (prompt tokens)."""

    token_id: int
    token: str
    logprob: float | None
    top: tuple[tuple[int, str, float], ...] = ()
    rank: int | None = None

    def __post_init__(self) -> None:
        # A token a grammar forbids has logprob -inf, which JSON cannot carry (Flask would write
        # `-Infinity`); vLLM's own server writes -9999.0 for it, and so do both our engines.
        if self.logprob is None:
            return
        if self.logprob < LOGPROB_FLOOR or any(lp < LOGPROB_FLOOR for _, _, lp in self.top):
            object.__setattr__(self, "logprob", max(self.logprob, LOGPROB_FLOOR))
            object.__setattr__(self, "top", tuple((t, s, max(lp, LOGPROB_FLOOR)) for t, s, lp in self.top))


class Piece(str):
    """A streamed piece of a sequence's text, carrying the logprob records of the tokens it is
    the first piece to cover (empty without `logprobs`). A `str`, so a reader that wants only
    the text uses it as one; a reader that wants the records takes `piece.logprobs` instead of
    looking at `Sequence.logprobs`, which the engine is still appending to. `generated`: the
    sequence's tokens so far, this piece's included (`token_ids` keeps growing meanwhile)."""

    logprobs: tuple[TokenLogprob, ...]
    generated: int

    def __new__(cls, text: str, logprobs: tuple[TokenLogprob, ...] = (), generated: int = 0) -> Piece:
        piece = super().__new__(cls, text)
        piece.logprobs, piece.generated = logprobs, generated
        return piece
