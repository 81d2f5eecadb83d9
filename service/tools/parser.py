"""The constrained reply (service/tools/spec.py's format) parsed back into OpenAI's shapes: whole, or
piece by piece as a stream makes it (`Decoder`, for the chat chunks and the Responses events).

The grammar puts `name` before `arguments` and writes compact JSON, so a call's text is
`{"tool_call":{"name":"<name>","arguments":<arguments>}}`: its name is known as soon as
`"arguments":` is written, and its arguments are what follows, less the two closing braces.
A reply cut short by max_tokens is no call: its text (decoded as far as it goes, for a
`{"response":"...` cut mid-string) is the content, with finish_reason "length".
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

from batcher.sequence import Sequence
from service.tools.spec import Tools

CALL_HEAD = re.compile(r'^\{"tool_call":\{"name":"([a-zA-Z0-9_-]+)","arguments":')
TEXT_HEAD = '{"response":"'
CALL_TAIL = "}}"  # closes the call and the reply
TEXT_TAIL = '"}'
LONGEST_ESCAPE = 6  # \uXXXX: what a string's text may end in, undecodable yet


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _string_prefix(body: str) -> str:
    """The decoded text of a JSON string's body as far as it decodes (it may end mid-escape)."""
    for cut in range(min(LONGEST_ESCAPE, len(body)) + 1):
        try:
            return json.loads(f'"{body[: len(body) - cut]}"')
        except json.JSONDecodeError:
            continue
    return ""


@dataclass
class Decoder:
    """Feed it the reply's text, piece by piece; it says what became known: `("call", name)` once,
    then `("arguments", fragment)`s, or `("content", fragment)`s. `finish()` gives the rest."""

    tools: Tools | None
    text: str = ""
    name: str | None = None
    sent: int = 0  # characters of arguments, or of decoded content, given out so far
    id: str = field(default_factory=call_id)

    def _kind(self) -> str:
        if self.tools is None or not self.tools.constrained:
            return "plain"
        if self.name is not None or CALL_HEAD.match(self.text):
            return "call"
        if self.text.startswith(TEXT_HEAD):
            return "text"
        return "pending" if TEXT_HEAD.startswith(self.text) or self.text.startswith("{") else "plain"

    def _events(self, final: bool) -> list[tuple[str, str]]:
        kind, events = self._kind(), []
        if kind == "plain":
            available = self.text
        elif kind == "call":
            if self.name is None:
                head = CALL_HEAD.match(self.text)
                self.name, self._start = head.group(1), head.end()
                events.append(("call", self.name))
            available = self.text[self._start :]
            available = available[: -len(CALL_TAIL)] if final and available.endswith(CALL_TAIL) else available
            available = available if final else available[: -len(CALL_TAIL)]
        elif kind == "text":
            body = self.text[len(TEXT_HEAD) :]
            body = body[: -len(TEXT_TAIL)] if final and body.endswith(TEXT_TAIL) else body
            available = _string_prefix(body if final else body[: -len(TEXT_TAIL)])
        else:  # not yet known whether it is a call: nothing to say
            return events
        if len(available) > self.sent:
            events.append(("arguments" if kind == "call" else "content", available[self.sent :]))
            self.sent = len(available)
        return events

    def feed(self, piece: str) -> list[tuple[str, str]]:
        self.text += piece
        return self._events(final=False)

    def finish(self) -> list[tuple[str, str]]:
        events = self._events(final=True)
        if self._kind() == "pending" and self.text:  # cut short before a call or a text began
            events.append(("content", self.text))
        return events


def parse(text: str, tools: Tools | None) -> tuple[str | None, dict | None]:
    """(content, call) of a whole reply: a call with its arguments as JSON text, or content."""
    decoder = Decoder(tools)
    events = decoder.feed(text) + decoder.finish()
    if decoder.name is not None:
        if not _whole(text):  # cut short by max_tokens: not a call, whatever it began as
            return text, None
        arguments = "".join(part for kind, part in events if kind == "arguments")
        return None, {"id": decoder.id, "type": "function", "function": {"name": decoder.name, "arguments": arguments}}
    return "".join(part for kind, part in events if kind == "content"), None


def _whole(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def finish_reason(seq: Sequence, call: dict | None) -> str | None:
    """OpenAI's: "tool_calls" when the reply is a whole call."""
    return "tool_calls" if call is not None and seq.finish_reason == "stop" else seq.finish_reason
