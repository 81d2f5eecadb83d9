"""Continuous batching through vLLM: /generate_vllm and /generate_vllm_stream, same contract."""

from flask import Blueprint

from service import auth, completion, schema

bp = auth.protect(Blueprint("vllm", __name__))


@bp.post("/generate_vllm")
def generate_vllm():
    req = schema.from_request()
    return completion.reply(completion.complete(completion.engine("vllm"), req.prompts, req.params, req.n), req)


@bp.post("/generate_vllm_stream")
def generate_vllm_stream():
    return completion.stream(completion.engine("vllm"), schema.from_request(single=True))
