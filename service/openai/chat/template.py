"""A chat conversation's rendering: one for both engines, for chat, the Responses API and
/tokenize (the messages as the request's model reads them, service/openai/chat/protocol.py).

The template is the model's own, or the file CHAT_TEMPLATE names (as vLLM's `--chat-template`).
A template that reads `tools` renders the tools and the tool turns itself (transformers'
`apply_chat_template(..., tools=...)`); one that does not (SmolLM2's) gets them written in our
format (service/tools/prompt.py).
"""

from __future__ import annotations

import functools

import jinja2
import jinja2.meta

from batcher.sampling import SamplingParams
from batcher.sequence import Prompt
from service import context_length
from service.errors import InvalidRequest
from service.plan import Served
from service.tools import prompt as tool_prompt
from service.tools.spec import Tools


@functools.cache
def _template_file(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


@functools.cache
def reads_tools(template: str) -> bool:
    """Whether a chat template renders `tools` (it names the variable)."""
    try:
        return "tools" in jinja2.meta.find_undeclared_variables(jinja2.Environment().parse(template))
    except jinja2.TemplateSyntaxError:  # a tag of transformers' own (`{% generation %}`): read the text
        return "tools" in template


def template(served: Served) -> str:
    """CHAT_TEMPLATE's file, or the model's own template; a 400 where there is neither."""
    path = served.config.chat_template
    text = _template_file(path) if path else served.tokenizer.chat_template
    if not text:
        raise InvalidRequest("this model has no chat template: use /completions with a prompt", param="messages")
    return text


def render(served: Served, messages: list[dict], tools: Tools | None = None, *, add_generation_prompt=True) -> str:
    """The chat template (CHAT_TEMPLATE's, or the model's own), the same rendering for both
    engines (and /tokenize); `messages` as the template reads them (the request model's
    `template_messages`); `tools`: the request's, when it has some."""
    text = template(served)
    kwargs = {"tokenize": False, "add_generation_prompt": add_generation_prompt, "chat_template": text}
    if reads_tools(text):
        tool_list = tool_prompt.openai_tools(tools) if tools is not None and tools.constrained else None
        return served.tokenizer.apply_chat_template(messages, tools=tool_list, **kwargs)
    return served.tokenizer.apply_chat_template(tool_prompt.plain(messages, tools), **kwargs)


def fixed_prefix(served: Served, messages: list[dict], tools: Tools | None = None) -> str:
    """The start of the rendering that a cut must leave whole (service/context_length.py): everything
    before the first non-system message's content, i.e. the system turn and the user's role
    marker (and, with tools, the turn that states them), found by rendering that message with a
    marker for its content."""
    first = next((i for i, m in enumerate(messages) if m["role"] != "system"), len(messages) - 1)
    marker = "\x00prefix\x00"  # text no message has (a NUL is refused nowhere, but no one sends it)
    marked = [*messages[:first], {**messages[first], "content": marker}]
    rendered = render(served, marked, tools, add_generation_prompt=False)
    return rendered[: rendered.index(marker)] if marker in rendered else ""


def fit_prompt(
    served: Served, messages: list[dict], tools: Tools | None, params: SamplingParams, truncate: int | None, param: str
) -> tuple[Prompt, ...]:
    """The one prompt a chat conversation runs as: rendered, checked against the context length
    and cut where `truncate_prompt_tokens` asks, its fixed prefix whole. Chat and Responses run it."""
    rendered = render(served, messages, tools)
    prefixes = [fixed_prefix(served, messages, tools)]
    return context_length.fit(
        [rendered], truncate=truncate, max_tokens=params.max_tokens, param=param,
        tokenizer=served.tokenizer, config=served.config, prefixes=prefixes,
    )  # fmt: skip
