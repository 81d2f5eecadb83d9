"""Our request, in vLLM's words, and vLLM's answer in ours: a `Sequence`'s prompt and parameters
as vLLM's prompt and `SamplingParams`, and the logprobs of a step's output (and of the prompt)
as our `TokenLogprob` records."""

from __future__ import annotations

from batcher.errors import EngineError, InvalidParams, RoundFailed
from batcher.grammar import vllm_params
from batcher.sequence import Sequence
from batcher.tokens import TokenLogprob


def engine_prompt(seq: Sequence):
    """Text as it is (vLLM tokenizes it), token ids as a `TokensPrompt`; whole: the service
    checked the context length (service/context_length.py)."""
    if isinstance(seq.prompt, str):
        return seq.prompt
    return {"prompt_token_ids": list(seq.prompt)}


def sampling_params(seq: Sequence):
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    p = seq.params
    return SamplingParams(
        max_tokens=p.max_tokens,
        temperature=p.temperature,
        top_p=p.top_p,
        top_k=max(p.top_k, 0),  # ours: -1 or 0 disable; vLLM prefers 0
        min_p=p.min_p,
        presence_penalty=p.presence_penalty,
        frequency_penalty=p.frequency_penalty,
        repetition_penalty=p.repetition_penalty,
        min_tokens=p.min_tokens,
        logit_bias=dict(p.logit_bias) or None,
        stop=list(p.stop),
        stop_token_ids=list(p.stop_token_ids),
        seed=p.seed,
        logprobs=p.logprobs,
        prompt_logprobs=p.prompt_logprobs,
        ignore_eos=p.ignore_eos,
        structured_outputs=vllm_params(p.structured),
        output_kind=RequestOutputKind.DELTA,  # each step hands out only the new text
    )


def logprob_records(seq: Sequence, completion) -> list[TokenLogprob]:
    """vLLM's per-token {token id: Logprob} dicts (the top k by rank, plus the chosen token)
    as our records; the EOS or stop token that ended the sequence has its record too (it has no
    text), on both engines, as vLLM's own server returns it."""
    if completion.logprobs is None:
        return []
    k = seq.params.logprobs
    records = []
    for token, alternatives in zip(completion.token_ids, completion.logprobs, strict=True):
        chosen = alternatives[token]
        ranked = sorted((lp for lp in alternatives.items() if lp[1].rank <= k), key=lambda lp: lp[1].rank)
        top = tuple((tid, lp.decoded_token or "", lp.logprob) for tid, lp in ranked[:k])
        records.append(TokenLogprob(token, chosen.decoded_token or "", chosen.logprob, top))
    return records


def prompt_logprob_records(seq: Sequence, prompt_ids, prompt_logprobs, tokenizer) -> list[TokenLogprob]:
    """vLLM's `RequestOutput.prompt_logprobs` (None for the first token, then per token a
    {token id: Logprob} dict of the prompt's token and the top k by rank) as our records; the
    first token's text is decoded as vLLM's server decodes it for `echo`."""
    k = seq.params.prompt_logprobs
    records = []
    for token, alternatives in zip(prompt_ids, prompt_logprobs, strict=True):
        if alternatives is None:  # the first token: vLLM names no text; ours, as the static path's
            records.append(TokenLogprob(token, tokenizer.decode([token]), None))
            continue
        chosen = alternatives[token]
        ranked = sorted((lp for lp in alternatives.items() if lp[1].rank <= k), key=lambda lp: lp[1].rank)
        top = tuple((tid, lp.decoded_token or "", lp.logprob) for tid, lp in ranked[:k])
        records.append(TokenLogprob(token, chosen.decoded_token or "", chosen.logprob, top, chosen.rank))
    return records


def refusal(seq: Sequence, exc: Exception) -> EngineError:
    """What `add_request` raised, in our words. vLLM's own checks of a request raise its
    `VLLMClientError` (a 4xx in its server): a schema feature its xgrammar backend does not
    support, say, which our parser lets through because xgrammar alone ignores it. That is the
    client's to fix, so a 4xx naming the field; anything else is a failed generation (500)."""
    from vllm.exceptions import VLLMClientError

    if isinstance(exc, VLLMClientError):
        param = getattr(exc, "parameter", None) or ("structured_outputs" if seq.params.structured else None)
        return InvalidParams(f"vLLM refused the request: {exc}", param=param)
    return RoundFailed(f"vLLM refused the prompt: {type(exc).__name__}: {exc}")
