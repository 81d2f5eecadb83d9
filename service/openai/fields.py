"""What the OpenAI routes do with each request field, as data: one table per route, checked by
`check()` (through `parse`, every OpenAI route's one way to read its body) before the body's
model validates it.

Every field of OpenAI's and vLLM 0.32's request schemas (vllm/entrypoints/openai/completion/
protocol.py, chat_completion/protocol.py) is in the table, with one of three rules:
- HONOURED: declared by the route's model (its folder's protocol.py), applied on both engines;
- IGNORED: accepted and ignored, because it does not change the output (`user`, `metadata`, ...);
- `refused(*allowed)`: a 400 `invalid_request_error` naming the field in `param`, unless its
  value is one of `allowed` (null, or the value that means what the service does anyway:
  `echo: false`, `best_of: 1`, `tool_choice: "none"`, `modalities: ["text"]`, ...).
A field in no table is accepted and ignored, as vLLM does (its `OpenAIBaseModel` has
`extra="allow"` and only logs the names at debug level); we log them at debug level too.
vLLM's removed `guided_*` fields are the exception there (it accepts them and warns that the output
is NOT constrained): we refuse them, since they ask for a constraint we would not apply.
The Responses API is a subset: there, a field in no table is refused (UNKNOWN).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from pydantic import BaseModel

from service.config import Config
from service.errors import InvalidRequest
from service.openai.chat.protocol import Chat
from service.openai.completions.protocol import Completion
from service.openai.protocol import StreamOptions
from service.openai.responses.protocol import Responses
from service.openai.tokenize.protocol import Detokenize, TokenizeChat, TokenizeText
from service.protocol import Body, names, validate

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rule:
    does: str  # "honoured" | "ignored" | "refused"
    allowed: tuple = ()  # refused: the values that are accepted anyway (null always is)
    why: str = ""

    def accepts(self, value) -> bool:
        return self.does != "refused" or value is None or any(_same(value, a) for a in self.allowed)


HONOURED, IGNORED = Rule("honoured"), Rule("ignored")


def refused(*allowed, why: str = "") -> Rule:
    return Rule("refused", allowed, why)


def _same(value, allowed) -> bool:
    # JSON true is not 1 and false is not 0 (Python's == says they are)
    return isinstance(value, bool) == isinstance(allowed, bool) and value == allowed


CHAT_TOOLS = "tools are a chat field (/chat/completions, /responses)"
FUNCTIONS = "OpenAI deprecated it; use 'tools' and 'tool_choice'"
NO_AUDIO = "this service makes text only"
NOT_YET = "not implemented yet"
NO_REASONING = "the served model does not reason"
GUIDED = "vLLM removed it; use 'structured_outputs' or 'response_format'"


def honoured(*models: type[BaseModel], prefix: str = "") -> dict[str, Rule]:
    """Every field the models declare (service/openai/protocol.py): what the routes implement."""
    return {f"{prefix}{name}": HONOURED for model in models for name in names(model)}


STREAM_OPTIONS = honoured(StreamOptions, prefix="stream_options.")

# what neither route implements, or what changes nothing, on both; each route's models say the rest
SHARED: dict[str, Rule] = {
    # they change no token of the output: who asked, caching and routing hints, how chunks are cut,
    # what only vLLM's render endpoints or reasoning parsers return
    **dict.fromkeys(
        """user metadata store service_tier safety_identifier prompt_cache_key prompt_cache_retention
        prompt_cache_options stream_options.include_obfuscation request_id session_id cache_salt
        stream_interval mm_payload return_mm_kwargs return_token_offsets routed_experts_prompt_start
        include_reasoning""".split(),
        IGNORED,
    ),
    # vLLM's extras we do not implement
    "use_beam_search": refused(False, why="beam search is not implemented"),
    "length_penalty": refused(1, why="it applies to beam search, which is not implemented"),
    "watermarking": refused(False, why=NOT_YET),
    "include_stop_str_in_output": refused(False, why="the stop string is always cut off"),
    "skip_special_tokens": refused(True, why="special tokens are always skipped"),
    "spaces_between_special_tokens": refused(True, why=NOT_YET),
    "truncation_side": refused("left", why="a cut keeps the prompt's last tokens"),
    "allowed_token_ids": refused(why=NOT_YET),
    "bad_words": refused([], why=NOT_YET),
    "logprob_token_ids": refused(why=NOT_YET),
    "prompt_embeds": refused(why="prompts are text"),
    "add_special_tokens": refused(why="prompts are tokenized with the tokenizer's defaults"),
    "priority": refused(0, why="requests are served first come, first served"),
    "return_tokens_as_token_ids": refused(False, why=NOT_YET),
    "return_token_ids": refused(False, why=NOT_YET),
    "kv_transfer_params": refused(why="no disaggregated serving"),
    "ec_transfer_params": refused(why="no disaggregated serving"),
    "vllm_xargs": refused(why="no custom extensions"),
    "repetition_detection": refused(why=NOT_YET),
    "thinking_token_budget": refused(why=NO_REASONING),
    **dict.fromkeys(
        """guided_json guided_regex guided_choice guided_grammar guided_decoding_backend
        guided_whitespace_pattern guided_json_object""".split(),
        refused(why=GUIDED),
    ),
    # OpenAI's fields of either route that we do not implement, refused on both
    "suffix": refused(why="insertion is not implemented"),
    "best_of": refused(1, why="best_of is not implemented (n is)"),
    "tools": refused(why=CHAT_TOOLS),
    "tool_choice": refused("none", why=CHAT_TOOLS),
    "parallel_tool_calls": refused(why=CHAT_TOOLS),
    "functions": refused(why=FUNCTIONS),
    "function_call": refused("none", why=FUNCTIONS),
    "audio": refused(why=NO_AUDIO),
    "modalities": refused(["text"], why=NO_AUDIO),
    "prediction": refused(why="predicted outputs are not implemented"),
    "reasoning_effort": refused(why=NO_REASONING),
    "verbosity": refused(why=NOT_YET),
    "web_search_options": refused(why="this service does not search the web"),
    "moderation": refused(why="this service does not moderate"),
}

COMPLETIONS: dict[str, Rule] = {
    **SHARED,
    **honoured(Completion),
    **STREAM_OPTIONS,
    "max_completion_tokens": refused(why="a chat field: /completions takes 'max_tokens'"),
    "messages": refused(why="a chat field: /completions takes 'prompt'"),
}

CHAT: dict[str, Rule] = {
    **SHARED,
    **honoured(Chat),  # echo: vLLM's, the reply starts with the last (assistant) message's text
    **STREAM_OPTIONS,
    "add_generation_prompt": refused(True, why="the generation prompt is always added"),
    "continue_final_message": refused(False, why=NOT_YET),
    "documents": refused(why="the chat template is rendered with the messages alone"),
    "chat_template": refused(why="the model's own chat template is used"),
    "chat_template_kwargs": refused(why="the chat template is rendered with the messages alone"),
    "media_io_kwargs": refused(why="messages are text"),
    "mm_processor_kwargs": refused(why="messages are text"),
    "return_prompt_text": refused(False, why=NOT_YET),
    "prompt": refused(why="a /completions field: chat takes 'messages'"),
}

# vLLM's /tokenize (its TokenizeCompletionRequest | TokenizeChatRequest) and /detokenize
TOKENIZE: dict[str, Rule] = honoured(TokenizeText)

TOKENIZE_CHAT: dict[str, Rule] = {
    **honoured(TokenizeChat),
    **{name: CHAT[name] for name in "continue_final_message chat_template chat_template_kwargs".split()},
    **{name: CHAT[name] for name in "media_io_kwargs mm_processor_kwargs".split()},
    "tools": refused(why="/tokenize renders the messages alone"),
}

DETOKENIZE: dict[str, Rule] = honoured(Detokenize)

RESPONSES: dict[str, Rule] = {
    **honoured(Responses),
    **dict.fromkeys("metadata user safety_identifier prompt_cache_key service_tier stream_options".split(), IGNORED),
    "conversation": refused(why="a conversation here is a chain of responses: 'previous_response_id'"),
    "include": refused([], why="a response carries its output alone"),
}

ROUTES = {
    "completions": COMPLETIONS,
    "chat": CHAT,
    "responses": RESPONSES,
    "tokenize": TOKENIZE,
    "tokenize_chat": TOKENIZE_CHAT,
    "detokenize": DETOKENIZE,
}
# the rule for a field in no table, where it is not "ignored, logged at debug level" (vLLM's)
UNKNOWN = {"responses": refused(why="the Responses API here is a subset (docs/openai.md)")}


def parse(body: dict, model: type[Body], route: str, config: Config) -> Body:
    """The request's JSON body as `model`, every field checked once: the refused ones by the
    route's table, the honoured ones (and what spans them) by the model."""
    check(body, route)
    return validate(model, body, config)


def check(body: dict, route: str) -> None:
    """Raise `InvalidRequest` naming the first field of `body` that `route` refuses."""
    table, unknown = ROUTES[route], []
    for key, value in body.items():
        _check_one(route, table, key, value, unknown)
        if isinstance(value, dict) and any(name.startswith(f"{key}.") for name in table):
            for sub, subvalue in value.items():
                _check_one(route, table, f"{key}.{sub}", subvalue, unknown)
    if unknown:
        log.debug("fields nobody defined, ignored: %s", ", ".join(unknown))


def _check_one(route: str, table: dict[str, Rule], name: str, value, unknown: list[str]) -> None:
    rule = table.get(name, UNKNOWN.get(route))
    if rule is None:
        unknown.append(name)
    elif not rule.accepts(value):
        allowed = "".join(f" or {json.dumps(a)}" for a in rule.allowed)
        message = f"'{name}' is not supported here: {rule.why} (send null{allowed}, or leave it out)"
        raise InvalidRequest(message, param=name)
