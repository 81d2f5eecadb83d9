"""`echo`, as vLLM 0.32 does it (entrypoints/openai/completion/serving.py, chat_completion/):

- /completions: each choice's text starts with its prompt (a token-id prompt: its decoded text),
  and with `logprobs` the prompt's tokens lead `tokens`/`token_logprobs`/`top_logprobs`/
  `text_offset`, the first one's logprob null (the engine computes the prompt's logprobs at the
  request's `logprobs`, see service/openai/serving.py's `plan`). `max_tokens: 0` (allowed only with
  echo): the engine generates one token, and the reply holds the prompt alone.
- chat: the reply starts with the last message's content when that message is the assistant's;
  its logprobs stay the generated tokens'.
A stream sends the echo in each choice's first chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

from batcher.sequence import Prompt, Sequence
from batcher.tokens import TokenLogprob


@dataclass(frozen=True)
class Echo:
    texts: list[str]  # per prompt of the request
    only: bool = False  # max_tokens 0: the prompt alone
    records: bool = True  # the prompt's logprob records lead the choice's (completions)
    top_logprobs: int | None = None  # chat's: the prompt's logprobs are computed at it

    def text(self, prompt: int, generated: str) -> str:
        return self.texts[prompt] + ("" if self.only else generated)

    def logprobs(self, seq: Sequence, generated: list[TokenLogprob]) -> list[TokenLogprob]:
        prompt = (seq.prompt_logprobs or []) if self.records else []
        return prompt + ([] if self.only else generated)

    def prompt_logprobs(self, logprobs: int | None) -> int | None:
        """The prompt logprobs echo asks for, as vLLM: the request's `logprobs` (completions),
        chat's `top_logprobs`."""
        return logprobs if self.records else self.top_logprobs


def for_completions(prompts: list[Prompt], only: bool, tokenizer) -> Echo:
    """`prompts` as the engines run them (cut where `truncate_prompt_tokens` asked). A token-id
    prompt echoes as the tokenizer decodes it (vLLM decodes them with the tokenizer's defaults,
    special tokens included)."""
    texts = [p if isinstance(p, str) else tokenizer.decode(list(p)) for p in prompts]
    return Echo(texts, only)


def for_chat(messages: list[dict], top_logprobs: int | None) -> Echo:
    """`messages`: as rendered (role and text content)."""
    last = messages[-1]
    return Echo([last["content"] if last["role"] == "assistant" else ""], records=False, top_logprobs=top_logprobs)
