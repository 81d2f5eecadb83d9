"""What serving /completions and /chat/completions share, from the plan to the reply: the plan of
an OpenAI body (once its API has the prompts as they run and their parameters), and its run into
the reply in the API's `Shape` (completions/serving.py, chat/serving.py), whole or as server-sent
chunks: one per piece of text as each decoding step makes it, a last one per choice, the usage
chunk if asked, then [DONE]."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from flask import Response, jsonify

from batcher.errors import EngineError
from batcher.sampling import SamplingParams
from batcher.sequence import Prompt, Sequence
from batcher.tokens import Piece, TokenLogprob
from service import batching, errors, generation
from service.errors import ApiError
from service.generation import Run
from service.http import sse
from service.openai.echo import Echo
from service.openai.protocol import OpenAIBody, StreamOptions
from service.plan import Plan
from service.tools.spec import Tools


class Shape(Protocol):
    """One API's reply: whole (`choice`, `extras`) or streamed (`opening`, `deltas`)."""

    prefix: str  # of the reply's id: "cmpl", "chatcmpl"
    object: str  # the whole reply's
    chunk_object: str  # each chunk's

    def choice(self, index: int, seq: Sequence, text: str, records: list[TokenLogprob] | None) -> dict:
        """A whole reply's choice; `text` and `records`: the completion's (after an echo, if any)."""

    def extras(self, seqs: list[Sequence]) -> dict:
        """What the whole reply carries beside its choices."""

    def opening(self, count: int) -> list[dict]:
        """The choices a stream opens with, before any text."""

    def deltas(
        self, index: int, text: str, records: list[TokenLogprob] | None, offset: int, finish_reason: str | None
    ) -> list[dict]:
        """A stream's choices for one piece of a choice's text (`offset`: its characters before);
        none while nothing can be said yet, two where a piece holds two events."""


def usage(seqs: list[Sequence], n: int) -> dict:
    """Token counts of a request's sequences, grouped per prompt (its n in a row): each prompt's
    tokens once, however many completions it has, as vLLM counts them; every completion's own."""
    prompt = sum(seq.prompt_tokens or 0 for seq in seqs[::n])
    generated = sum(len(seq.token_ids) for seq in seqs)
    return {"prompt_tokens": prompt, "completion_tokens": generated, "total_tokens": prompt + generated}


def vllm_prompt_logprobs(records: list[TokenLogprob] | None) -> list[dict | None] | None:
    """vLLM's shape: per prompt token, null for the first, then {token id: {logprob, rank,
    decoded_token}} of the prompt's token and its top alternatives (by rank), the token first."""
    if records is None:
        return None

    def entry(r: TokenLogprob) -> dict:
        tokens = {str(r.token_id): {"logprob": r.logprob, "rank": r.rank, "decoded_token": r.token}}
        for rank, (tid, text, lp) in enumerate(r.top, 1):
            tokens.setdefault(str(tid), {"logprob": lp, "rank": rank, "decoded_token": text})
        return tokens

    return [None if r.logprob is None else entry(r) for r in records]


def plan(
    req: OpenAIBody,
    prompts: tuple[Prompt, ...],
    params: SamplingParams,
    echo: Echo | None = None,
    tools: Tools | None = None,
) -> Plan:
    """The request's plan: vLLM's `prompt_logprobs` where the request names them, else what
    `echo` asks for; how the reply is sent."""
    asked = req.prompt_logprobs
    prompt_logprobs = asked if asked is not None else echo.prompt_logprobs(params.logprobs) if echo else None
    options = req.stream_options or StreamOptions()
    return Plan(
        prompts=prompts,
        params=dataclasses.replace(params, prompt_logprobs=prompt_logprobs),
        n=req.n or 1,
        stream=bool(req.stream),
        include_usage=bool(options.include_usage),
        continuous_usage=bool(options.continuous_usage_stats),  # vLLM's: usage in every chunk too
        echo=echo,
        tools=tools,
        details=bool(req.details),
        max_queue_ms=req.max_queue_ms,
    )


def respond(shape: Shape, run: Run, plan: Plan) -> Response:
    """Run the plan (its prompts n times each) and answer as one JSON object, or as server-sent
    chunks with `stream`. Choices are grouped per prompt: prompt p's i-th completion has index p*n + i."""
    envelope = {"id": f"{shape.prefix}-{uuid.uuid4().hex}", "created": int(time.time()), "model": run.config.model_name}
    if plan.stream:
        pieces = generation.Pieces(run, plan.prompts, plan.params, plan.n)
        return sse.response(iter(Chunks(pieces, shape, {**envelope, "object": shape.chunk_object}, plan)))
    seqs = generation.complete(run, plan.prompts, plan.params, plan.n)
    choices = []
    for i, seq in enumerate(seqs):
        text, records = seq.text, seq.logprobs
        if plan.echo is not None:
            text, records = plan.echo.text(i // plan.n, text), plan.echo.logprobs(seq, records)
        choices.append(shape.choice(i, seq, text, records if plan.logprobs else None))
    reply = {**envelope, "object": shape.object, "choices": choices, "usage": usage(seqs, plan.n), **shape.extras(seqs)}
    if plan.details:  # our extension: what batching cost each choice (service/batching.py)
        reply["batching"] = [batching.cost(seq) for seq in seqs]
    return jsonify(reply)


DONE = sse.event("[DONE]")


@dataclass
class _Choice:
    """What a stream has sent of one choice."""

    index: int
    records: int = 0  # logprob records
    chars: int = 0  # characters of text
    echo_due: bool = False  # its first chunk, which starts with the echo, is still to come


class Chunks:
    """Iterate for the chunks of `pieces`: one per piece of text, a last one per choice with its
    finish_reason, the usage chunk if the plan asks (`include_usage`), then [DONE]; an error after
    the first byte is an error event, then [DONE]. With logprobs, each chunk carries those of the
    tokens generated since the choice's last one. `continuous_usage`: usage in every chunk too
    (that choice's prompt and its tokens so far, as vLLM's `continuous_usage_stats`). An echo:
    each choice's first chunk starts with it (and its prompt's records), as vLLM's; with
    `echo.only` the generated token is not sent."""

    def __init__(self, pieces: generation.Pieces, shape: Shape, envelope: dict, plan: Plan):
        self.pieces, self.shape, self.envelope, self.plan = pieces, shape, envelope, plan
        echoes = plan.echo is not None
        self.choices = {seq.id: _Choice(i, echo_due=echoes) for i, seq in enumerate(pieces.seqs)}

    def __iter__(self) -> Iterator[str]:
        try:
            opened = False
            for seq, text in self.pieces:
                if not opened:  # the first piece is here: its sequence's prompt is counted (chat: one prompt)
                    for choice in self.shape.opening(len(self.pieces.seqs)):
                        yield self._event(choice, seq.prompt_tokens, 0)
                    opened = True
                if text is not None:
                    out = self._chunk(seq, text)
                elif seq.error is not None:
                    raise seq.error
                else:
                    out = self._chunk(seq, "", seq.finish_reason)
                if out:
                    yield out
            if self.plan.include_usage:
                yield sse.event({**self.envelope, "choices": [], "usage": usage(self.pieces.seqs, self.plan.n)})
            yield DONE
        except (ApiError, EngineError) as exc:
            yield sse.event(errors.openai_error(exc)[0])
            yield DONE
        finally:
            self.pieces.close()  # also when the client went away: its sequences stop at their next step

    def _event(self, choice: dict, prompt_tokens: int | None, generated: int) -> str:
        if not self.plan.continuous_usage:
            return sse.event({**self.envelope, "choices": [choice]})
        counts = {"prompt_tokens": prompt_tokens, "completion_tokens": generated}
        counts["total_tokens"] = (prompt_tokens or 0) + generated
        return sse.event({**self.envelope, "choices": [choice], "usage": counts})

    def _chunk(self, seq: Sequence, text: str, finish_reason: str | None = None) -> str:
        """The chunks of one piece of `seq`'s text ("" where there is nothing to send yet)."""
        sent, echo, want = self.choices[seq.id], self.plan.echo, self.plan.logprobs
        records = None
        if want:  # a piece carries its tokens' records; at the end (the sequence done), the rest
            records = list(text.logprobs) if isinstance(text, Piece) else seq.logprobs[sent.records :]
            sent.records += len(records)
        # a piece carries its count; at the end the sequence is done and its own count is final
        generated = text.generated if isinstance(text, Piece) else len(seq.token_ids)
        text = str(text)
        if echo is not None:
            if sent.echo_due:
                sent.echo_due = False
                text = echo.text(sent.index // self.plan.n, text)
                records = echo.logprobs(seq, records) if want else None
            elif echo.only:
                if finish_reason is None:
                    return ""
                text, records = "", [] if want else None
        choices = self.shape.deltas(sent.index, text, records, sent.chars, finish_reason)
        sent.chars += len(text)
        return "".join(self._event(c, seq.prompt_tokens, generated) for c in choices)
