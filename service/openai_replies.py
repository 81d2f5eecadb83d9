"""OpenAI's reply shapes, one class per API (`TextShape` for /completions, `ChatShape` for
/chat/completions: whole replies, stream chunks and logprobs), and the `usage` they share."""

from __future__ import annotations

import itertools

from batcher.sequence import Sequence, TokenLogprob


def usage(seqs: list[Sequence], n: int) -> dict:
    """Token counts of a request's sequences, grouped per prompt (its n in a row): each prompt's
    tokens once, however many completions it has, as vLLM counts them; every completion's own."""
    prompt = sum(seq.prompt_tokens or 0 for seq in seqs[::n])
    generated = sum(len(seq.token_ids) for seq in seqs)
    return {"prompt_tokens": prompt, "completion_tokens": generated, "total_tokens": prompt + generated}


class TextShape:
    """/completions: one choice per prompt (n per prompt), `text` in the reply and in each chunk."""

    prefix, object, chunk_object = "cmpl", "text_completion", "text_completion"

    @staticmethod
    def logprobs(records: list[TokenLogprob] | None, offset: int = 0) -> dict | None:
        """{tokens, token_logprobs, top_logprobs, text_offset}; `offset`: characters before."""
        if records is None:
            return None
        offsets = list(itertools.accumulate((len(r.token) for r in records[:-1]), initial=offset))
        return {
            "tokens": [r.token for r in records],
            "token_logprobs": [r.logprob for r in records],
            "top_logprobs": [{text: lp for _, text, lp in r.top} for r in records],
            "text_offset": offsets if records else [],
        }

    @classmethod
    def choice(cls, index: int, seq: Sequence, records: list[TokenLogprob] | None) -> dict:
        return {"index": index, "text": seq.text, "logprobs": cls.logprobs(records), "finish_reason": seq.finish_reason}

    @staticmethod
    def opening(count: int) -> list[dict]:
        return []

    @classmethod
    def delta(cls, index: int, text: str, records=None, offset: int = 0, finish_reason: str | None = None) -> dict:
        return {"index": index, "text": text, "logprobs": cls.logprobs(records, offset), "finish_reason": finish_reason}


class ChatShape:
    """/chat/completions: an assistant `message`; chunks carry a `delta`, the first one the role."""

    prefix, object, chunk_object = "chatcmpl", "chat.completion", "chat.completion.chunk"

    @staticmethod
    def logprobs(records: list[TokenLogprob] | None, offset: int = 0) -> dict | None:
        """{content: [{token, logprob, bytes, top_logprobs}], refusal}"""
        if records is None:
            return None

        def entry(text: str, logprob: float) -> dict:
            return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

        content = [{**entry(r.token, r.logprob), "top_logprobs": [entry(t, lp) for _, t, lp in r.top]} for r in records]
        return {"content": content, "refusal": None}

    @classmethod
    def choice(cls, index: int, seq: Sequence, records: list[TokenLogprob] | None) -> dict:
        message = {"role": "assistant", "content": seq.text}
        logprobs = cls.logprobs(records)
        return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": seq.finish_reason}

    @staticmethod
    def opening(count: int) -> list[dict]:
        return [
            {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
            for i in range(count)
        ]

    @classmethod
    def delta(cls, index: int, text: str, records=None, offset: int = 0, finish_reason: str | None = None) -> dict:
        delta = {"content": text} if text else {}
        return {"index": index, "delta": delta, "logprobs": cls.logprobs(records), "finish_reason": finish_reason}
