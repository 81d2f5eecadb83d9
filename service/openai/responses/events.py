"""The Responses API's server-sent events for one streamed reply, in OpenAI's order:
response.created, response.in_progress, then for the one output item
response.output_item.added and either (text) response.content_part.added,
response.output_text.delta..., response.output_text.done, response.content_part.done, or (a
call) response.function_call_arguments.delta..., response.function_call_arguments.done; then
response.output_item.done and response.completed (response.incomplete when max_output_tokens
cut it); a stored response is written just before that last event. Each event names its
`type` on an `event:` line too, and counts `sequence_number`. An error after the first byte is an
`error` event, and the stream ends."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator

from batcher.errors import EngineError
from service import errors, generation
from service.errors import ApiError
from service.openai.responses import shape
from service.tools.parser import Decoder
from service.tools.spec import Tools

Keep = Callable[[dict], None]


class _Events:
    def __init__(self, response: dict, tools: Tools | None, keep: Keep | None):
        self.response, self.decoder, self.number, self.keep = response, Decoder(tools), 0, keep
        self.item: dict | None = None  # the output item, once its kind is known
        self.text = ""  # the message's text or the call's arguments so far

    def event(self, kind: str, **fields) -> str:
        payload = {"type": kind, "sequence_number": self.number, **fields}
        self.number += 1
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"

    def _where(self) -> dict:
        return {"item_id": self.item["id"], "output_index": 0}

    def _open_message(self) -> Iterator[str]:
        self.item = shape.message_item(f"msg_{uuid.uuid4().hex}", "", "in_progress")
        self.item["content"] = []
        yield self.event("response.output_item.added", output_index=0, item=self.item)
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        yield self.event("response.content_part.added", **self._where(), content_index=0, part=part)

    def translate(self, events: list[tuple[str, str]]) -> Iterator[str]:
        for kind, part in events:
            if kind == "call":
                call = {"id": self.decoder.id, "function": {"name": part, "arguments": ""}}
                self.item = shape.call_item(f"fc_{uuid.uuid4().hex}", call, "in_progress")
                yield self.event("response.output_item.added", output_index=0, item=self.item)
            elif kind == "arguments":
                self.text += part
                yield self.event("response.function_call_arguments.delta", **self._where(), delta=part)
            else:
                if self.item is None:
                    yield from self._open_message()
                self.text += part
                where = {**self._where(), "content_index": 0}
                yield self.event("response.output_text.delta", **where, delta=part, logprobs=[])

    def close(self, seq) -> Iterator[str]:
        if self.item is None:
            yield from self._open_message()
        status = "incomplete" if seq.finish_reason == "length" else "completed"
        if self.item["type"] == "function_call":
            item = {**self.item, "arguments": self.text, "status": status}
            done = {**self._where(), "name": item["name"], "arguments": self.text}
            yield self.event("response.function_call_arguments.done", **done)
        else:
            item = shape.message_item(self.item["id"], self.text, status)
            where = {**self._where(), "content_index": 0}
            yield self.event("response.output_text.done", **where, text=self.text, logprobs=[])
            yield self.event("response.content_part.done", **where, part=item["content"][0])
        yield self.event("response.output_item.done", output_index=0, item=item)
        final = shape.finished(self.response, seq, item)
        if self.keep is not None:  # stored before the client hears it is done: then it is there to read
            self.keep(final)
        kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
        yield self.event(kind, response=final)


def events(pieces: generation.Pieces, response: dict, tools: Tools | None, keep: Keep | None) -> Iterator[str]:
    """Every event of the reply that `pieces` makes (one prompt, one sequence); `keep`: what
    stores the response once it is done, where the request asked for it."""
    stream = _Events(response, tools, keep)
    try:
        yield stream.event("response.created", response=response)
        yield stream.event("response.in_progress", response=response)
        for seq, text in pieces:
            if text is not None:
                yield from stream.translate(stream.decoder.feed(str(text)))
            elif seq.error is not None:
                raise seq.error
            else:
                yield from stream.translate(stream.decoder.finish())
                yield from stream.close(seq)
    except (ApiError, EngineError) as exc:
        body = errors.openai_error(exc)[0]["error"]
        yield stream.event("error", code=body["code"], message=body["message"], param=body["param"])
    finally:
        pieces.close()  # also when the client went away: its sequence stops at its next step
