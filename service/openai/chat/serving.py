"""`POST /v1/chat/completions`, served: the messages rendered and fitted to the context, the
plan, the run, and the reply in chat's shape: an assistant `message`, chunks with a `delta` (the
first one the role); with tools that constrain the reply (`ToolChatShape`), `message.tool_calls`
or the text answer, and in a stream OpenAI's tool-call deltas."""

from __future__ import annotations

from flask import Response

from batcher.sequence import Sequence
from batcher.tokens import TokenLogprob
from service.generation import RunFor
from service.openai import echo, serving
from service.openai.chat.protocol import Chat
from service.openai.chat.template import fit_prompt
from service.openai.serving import vllm_prompt_logprobs
from service.plan import Served
from service.tools import parser
from service.tools.spec import Tools


def create_chat_completion(req: Chat, served: Served, run_for: RunFor) -> Response:
    params = req.to_sampling_params(served.config)
    messages, tools = req.template_messages, req.function_tools
    prompts = fit_prompt(served, messages, tools, params, req.truncate_prompt_tokens, "messages")
    echoed = echo.for_chat(messages, req.top_logprobs) if req.echo else None
    plan = serving.plan(req, prompts, params, echoed, tools)
    return serving.respond(shape_for(tools), run_for(plan.max_queue_ms), plan)


def logprobs(records: list[TokenLogprob] | None) -> dict | None:
    """{content: [{token, logprob, bytes, top_logprobs}], refusal}"""
    if records is None:
        return None

    def entry(text: str, logprob: float) -> dict:
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    content = [{**entry(r.token, r.logprob), "top_logprobs": [entry(t, lp) for _, t, lp in r.top]} for r in records]
    return {"content": content, "refusal": None}


class ChatShape:
    prefix, object, chunk_object = "chatcmpl", "chat.completion", "chat.completion.chunk"

    def choice(self, index: int, seq: Sequence, text: str, records: list[TokenLogprob] | None) -> dict:
        message = {"role": "assistant", "content": text}
        return {"index": index, "message": message, "logprobs": logprobs(records), "finish_reason": seq.finish_reason}

    def extras(self, seqs: list[Sequence]) -> dict:
        """One prompt per chat request: its logprobs once, beside the choices."""
        if seqs[0].prompt_logprobs is None:
            return {}
        return {"prompt_logprobs": vllm_prompt_logprobs(seqs[0].prompt_logprobs)}

    def opening(self, count: int) -> list[dict]:
        return [
            {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
            for i in range(count)
        ]

    def deltas(self, index: int, text: str, records, offset: int, finish_reason: str | None) -> list[dict]:
        delta = {"content": text} if text else {}
        return [{"index": index, "delta": delta, "logprobs": logprobs(records), "finish_reason": finish_reason}]


class ToolChatShape(ChatShape):
    """`message.tool_calls` (content null), or the text answer; in a stream, the call's first
    delta has index, id, type, the function's name and arguments "", then argument fragments.
    One per request: it keeps each choice's decoder."""

    def __init__(self, tools: Tools):
        self.tools = tools
        self.decoders: dict[int, parser.Decoder] = {}

    def choice(self, index: int, seq: Sequence, text: str, records: list[TokenLogprob] | None) -> dict:
        content, call = parser.parse(text, self.tools)
        message = {"role": "assistant", "content": content}
        if call is not None:
            message["tool_calls"] = [call]
        reason = parser.finish_reason(seq, call)
        return {"index": index, "message": message, "logprobs": logprobs(records), "finish_reason": reason}

    def deltas(self, index: int, text: str, records, offset: int, finish_reason: str | None) -> list[dict]:
        """Two choices where a call's name and its first arguments came in one piece."""
        decoder = self.decoders.setdefault(index, parser.Decoder(self.tools))
        events = decoder.feed(text)
        if finish_reason is not None:
            events += decoder.finish()
            if decoder.name is not None and finish_reason == "stop":
                finish_reason = "tool_calls"
        deltas: list[dict] = []
        for kind, part in events:
            if kind == "call":
                opened = {"index": 0, "id": decoder.id, "type": "function", "function": {"name": part, "arguments": ""}}
                deltas.append({"tool_calls": [opened]})
            elif kind == "arguments":
                deltas.append({"tool_calls": [{"index": 0, "function": {"arguments": part}}]})
            else:
                deltas.append({"content": part})
        if not deltas and finish_reason is None and not records:  # nothing known yet: no chunk
            return []
        choices = [{"index": index, "delta": d, "logprobs": None, "finish_reason": None} for d in deltas or [{}]]
        choices[0]["logprobs"] = logprobs(records)
        choices[-1]["finish_reason"] = finish_reason
        return choices


def shape_for(tools: Tools | None) -> ChatShape:
    """The reply's shape: with tools where they constrain the reply, else plain."""
    return ToolChatShape(tools) if tools is not None and tools.constrained else ChatShape()
