"""vLLM's `/tokenize` and `/detokenize`, served. Shapes as vLLM 0.32's (vllm/entrypoints/serve/
tokenize/protocol.py): `{"prompt"}` or `{"messages", "add_generation_prompt"}` in, `{"count",
"max_model_len", "tokens"}` out (and `token_strs` with `return_token_strs`); `{"tokens"}` in,
`{"prompt"}` out. The text is the tokenizer's that both engines run, the chat rendering chat's
(service/openai/chat/template.py), and `max_model_len` what `/v1/models` reports."""

from __future__ import annotations

from service.openai.chat.template import render
from service.openai.tokenize.protocol import TokenizeChat, TokenizeText
from service.plan import Served


def tokenize(req: TokenizeText | TokenizeChat, served: Served) -> dict:
    if isinstance(req, TokenizeChat):
        generation_prompt = _or(req.add_generation_prompt, True)
        text = render(served, req.template_messages, add_generation_prompt=generation_prompt)
        add_special_tokens = _or(req.add_special_tokens, False)  # the template has them
    else:
        text, add_special_tokens = req.prompt, _or(req.add_special_tokens, True)
    ids = served.tokenizer(text, add_special_tokens=add_special_tokens).input_ids
    reply = {"count": len(ids), "max_model_len": served.config.max_model_len, "tokens": ids, "token_strs": None}
    if req.return_token_strs:
        reply["token_strs"] = served.tokenizer.convert_ids_to_tokens(ids)
    return reply


def detokenize(tokens: list[int], served: Served) -> dict:
    return {"prompt": served.tokenizer.decode(tokens)}


def _or(value: bool | None, default: bool) -> bool:
    return default if value is None else value
