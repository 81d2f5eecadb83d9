"""A vLLM engine as the service builds it, in a process of its own (vLLM holds one engine a
process well): `python -m tests.helpers.vllm_tokens SETTINGS_JSON PROMPTS_JSON` prints
one JSON line: each prompt's greedy token ids (8), and which of the model's layers read blocks
(batcher/vllm/blocks.py) with the size of the weight each still holds (0: one copy, the blocks)."""

from __future__ import annotations

import json
import os
import sys


def main(settings: str, prompts: str) -> None:
    """`settings`: VLLMSettings as the service resolved them (no Flask here: vLLM's CPU backend
    probes every imported module's attributes, and Flask's proxies raise outside a request)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process, as batcher/vllm/worker.py has it
    from batcher.settings import VLLMSettings

    values = json.loads(settings)
    settings = VLLMSettings(**{**values, "profile_step_s": tuple(map(tuple, values["profile_step_s"]))})
    from vllm import LLM, SamplingParams

    llm = LLM(**settings.engine_args())
    greedy = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    tokens = [list(out.outputs[0].token_ids) for out in llm.generate(json.loads(prompts), greedy, use_tqdm=False)]

    def blocks(model) -> dict:
        return {name: m.weight.numel() for name, m in model.named_modules() if "blocks" in m.__dict__}

    print(json.dumps({"dtype": settings.dtype, "tokens": tokens, "blocks": llm.apply_model(blocks)[0]}))


if __name__ == "__main__":
    main(*sys.argv[1:])
