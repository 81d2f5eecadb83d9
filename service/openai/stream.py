"""The OpenAI routes' server-sent chunks: one per piece of text as each decoding step makes it,
a last one per choice, the usage chunk if asked, then [DONE]."""

from __future__ import annotations

from collections.abc import Iterator

from batcher.errors import EngineError
from batcher.sequence import Sequence
from batcher.tokens import Piece
from service import errors, generation
from service.errors import ApiError
from service.http import sse
from service.openai.replies import usage
from service.plan import Plan

DONE = sse.event("[DONE]")


def chunks(pieces: generation.Pieces, shape, head: dict, plan: Plan) -> Iterator[str]:
    """One chunk per piece of text, a last one per choice with its finish_reason, the usage chunk
    if the plan asks (`include_usage`), then [DONE]; an error after the first byte is an error
    event, then [DONE]. With logprobs, each chunk carries those of the tokens generated since the
    choice's last one. `continuous_usage`: usage in every chunk too (that choice's prompt and its
    tokens so far, as vLLM's `continuous_usage_stats`). An echo: each choice's first chunk starts
    with it (and its prompt's records), as vLLM's; with `echo.only` the generated token is not sent."""
    n, want, echoed, continuous = plan.n, plan.logprobs, plan.echo, plan.continuous_usage
    index = {seq.id: i for i, seq in enumerate(pieces.seqs)}
    sent_records = dict.fromkeys(index, 0)
    sent_chars = dict.fromkeys(index, 0)
    to_echo = set(index) if echoed is not None else set()

    def event(choice: dict, prompt_tokens: int | None, generated: int) -> str:
        if not continuous:
            return sse.event({**head, "choices": [choice]})
        counts = {"prompt_tokens": prompt_tokens, "completion_tokens": generated}
        counts["total_tokens"] = (prompt_tokens or 0) + generated
        return sse.event({**head, "choices": [choice], "usage": counts})

    def chunk(seq: Sequence, text: str, finish_reason: str | None = None) -> str | None:
        records = None
        if want:  # a piece carries its tokens' records; at the end (the sequence done), the rest
            records = list(text.logprobs) if isinstance(text, Piece) else seq.logprobs[sent_records[seq.id] :]
            sent_records[seq.id] += len(records)
        # a piece carries its count; at the end the sequence is done and its own count is final
        generated = text.generated if isinstance(text, Piece) else len(seq.token_ids)
        text = str(text)
        if echoed is not None:
            if seq.id in to_echo:
                to_echo.discard(seq.id)
                text = echoed.text(index[seq.id] // n, text)
                records = echoed.logprobs(seq, records) if want else None
            elif echoed.only:
                if finish_reason is None:
                    return None
                text, records = "", [] if want else None
        choice = shape.delta(index[seq.id], text, records, sent_chars[seq.id], finish_reason)
        sent_chars[seq.id] += len(text)
        choices = choice if isinstance(choice, list) else [choice]  # a tool call's head is a chunk of its own
        return "".join(event(c, seq.prompt_tokens, generated) for c in choices) or None

    try:
        opened = False
        for seq, text in pieces:
            if not opened:  # the first piece is here: its sequence's prompt is counted (chat: one prompt)
                for choice in shape.opening(len(pieces.seqs)):
                    yield event(choice, seq.prompt_tokens, 0)
                opened = True
            if text is not None:
                out = chunk(seq, text)
            elif seq.error is not None:
                raise seq.error
            else:
                out = chunk(seq, "", seq.finish_reason)
            if out is not None:
                yield out
        if plan.include_usage:
            yield sse.event({**head, "choices": [], "usage": usage(pieces.seqs, n)})
        yield DONE
    except (ApiError, EngineError) as exc:
        yield sse.event(errors.openai_error(exc)[0])
        yield DONE
    finally:
        pieces.close()  # also when the client went away: its sequences stop at their next step
