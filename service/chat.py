"""Chat messages as the model's chat template reads them, and their rendering: one for both
engines, the chat route and /tokenize."""

from __future__ import annotations

from flask import current_app

from service.errors import InvalidRequest


def _message(i: int, message) -> dict:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise InvalidRequest(f"'messages[{i}]' must be an object with a 'role'", param="messages")
    content = message.get("content")
    if isinstance(content, list):  # content parts: only text ones have meaning for this model
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
            raise InvalidRequest(f"'messages[{i}].content' parts must be text parts", param="messages")
        content = "".join(part["text"] for part in content)
    if not isinstance(content, str):
        raise InvalidRequest(f"'messages[{i}].content' must be a string or a list of text parts", param="messages")
    return {"role": message["role"], "content": content}


def messages(messages) -> list[dict]:
    """The messages as the chat template reads them: role and text content."""
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' must be a non-empty list", param="messages")
    return [_message(i, m) for i, m in enumerate(messages)]


def render(messages: list[dict], *, add_generation_prompt: bool = True) -> str:
    """The model's own chat template, the same rendering for both engines (and /tokenize)."""
    tokenizer = current_app.extensions["tokenizer"]()
    if not tokenizer.chat_template:
        raise InvalidRequest("this model has no chat template: use /completions with a prompt", param="messages")
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def head(messages: list[dict]) -> str:
    """The start of the rendering that a cut must leave whole (service/context.py): everything
    before the first non-system message's content, i.e. the system turn and the user's role
    marker, found by rendering that message with a marker for its content."""
    first = next((i for i, m in enumerate(messages) if m["role"] != "system"), len(messages) - 1)
    marker = "\x00head\x00"  # text no message has (a NUL is refused nowhere, but no one sends it)
    marked = [*messages[:first], {**messages[first], "content": marker}]
    rendered = render(marked, add_generation_prompt=False)
    return rendered[: rendered.index(marker)] if marker in rendered else ""
