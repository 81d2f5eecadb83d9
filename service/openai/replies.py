"""OpenAI's reply shapes, one class per API (`TextShape` for /completions, `ChatShape` for
/chat/completions, `ToolChatShape` for chat with tools: whole replies, stream chunks and
logprobs), and what they share: `usage`, and vLLM's `prompt_logprobs` (per choice on
/completions, once per reply on chat, as vLLM puts them)."""

from __future__ import annotations

import itertools

from batcher.sequence import Sequence
from batcher.tokens import TokenLogprob
from service.tools import parser
from service.tools.spec import Tools


def usage(seqs: list[Sequence], n: int) -> dict:
    """Token counts of a request's sequences, grouped per prompt (its n in a row): each prompt's
    tokens once, however many completions it has, as vLLM counts them; every completion's own."""
    prompt = sum(seq.prompt_tokens or 0 for seq in seqs[::n])
    generated = sum(len(seq.token_ids) for seq in seqs)
    return {"prompt_tokens": prompt, "completion_tokens": generated, "total_tokens": prompt + generated}


def prompt_logprobs(records: list[TokenLogprob] | None) -> list[dict | None] | None:
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
            # an echoed prompt's first token: no alternatives either, as vLLM's null
            "top_logprobs": [None if r.logprob is None else {text: lp for _, text, lp in r.top} for r in records],
            "text_offset": offsets if records else [],
        }

    @classmethod
    def choice(cls, index: int, seq: Sequence, text: str, records: list[TokenLogprob] | None) -> dict:
        """`text` and `records`: the completion's, or with `echo` the prompt's and then its."""
        choice = {"index": index, "text": text, "logprobs": cls.logprobs(records), "finish_reason": seq.finish_reason}
        if seq.prompt_logprobs is not None:
            choice["prompt_logprobs"] = prompt_logprobs(seq.prompt_logprobs)
        return choice

    @staticmethod
    def extras(seqs: list[Sequence]) -> dict:
        return {}

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
    def choice(cls, index: int, seq: Sequence, text: str, records: list[TokenLogprob] | None) -> dict:
        message = {"role": "assistant", "content": text}
        logprobs = cls.logprobs(records)
        return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": seq.finish_reason}

    @staticmethod
    def extras(seqs: list[Sequence]) -> dict:
        """One prompt per chat request: its logprobs once, beside the choices."""
        if seqs[0].prompt_logprobs is None:
            return {}
        return {"prompt_logprobs": prompt_logprobs(seqs[0].prompt_logprobs)}

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


class ToolChatShape(ChatShape):
    """/chat/completions with tools: `message.tool_calls` (content null), or the text answer; in
    a stream, OpenAI's tool-call deltas: the first with index, id, type, the function's name and
    arguments "", then argument fragments. One instance per request (it keeps each choice's
    decoder)."""

    def __init__(self, tools: Tools):
        self.tools = tools
        self.decoders: dict[int, parser.Decoder] = {}

    def choice(self, index: int, seq: Sequence, text: str, records: list[TokenLogprob] | None) -> dict:
        content, call = parser.parse(text, self.tools)
        message = {"role": "assistant", "content": content}
        if call is not None:
            message["tool_calls"] = [call]
        reason = parser.finish_reason(seq, call)
        return {"index": index, "message": message, "logprobs": self.logprobs(records), "finish_reason": reason}

    def delta(self, index: int, text: str, records=None, offset: int = 0, finish_reason=None) -> list[dict]:
        """One chunk's choice, or two where a call's head and its first arguments came together."""
        decoder = self.decoders.setdefault(index, parser.Decoder(self.tools))
        events = decoder.feed(text)
        if finish_reason is not None:
            events += decoder.finish()
            if decoder.name is not None and finish_reason == "stop":
                finish_reason = "tool_calls"
        deltas: list[dict] = []
        for kind, part in events:
            if kind == "call":
                head = {"index": 0, "id": decoder.id, "type": "function", "function": {"name": part, "arguments": ""}}
                deltas.append({"tool_calls": [head]})
            elif kind == "arguments":
                deltas.append({"tool_calls": [{"index": 0, "function": {"arguments": part}}]})
            else:
                deltas.append({"content": part})
        if not deltas and finish_reason is None and not records:  # nothing known yet: no chunk
            return []
        choices = [{"index": index, "delta": d, "logprobs": None, "finish_reason": None} for d in deltas or [{}]]
        choices[0]["logprobs"] = self.logprobs(records)
        choices[-1]["finish_reason"] = finish_reason
        return choices
