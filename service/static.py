"""Static batching: /generate, /basic_generate, /generate_stream, served by the model thread."""

from flask import Blueprint

from service import auth, completion, schema

bp = auth.protect(Blueprint("static", __name__))


@bp.post("/generate")
def generate():
    req = schema.from_request()
    return completion.reply(completion.complete(completion.engine("static"), req.prompts, req.params, req.n), req)


@bp.post("/basic_generate")
def basic_generate():
    """One prompt, run as a round of its own on the same model thread: the unbatched baseline.
    It waits its turn like any prompt, but never shares its round, whatever else is waiting."""
    req = schema.from_request(single=True)
    seqs = completion.complete(completion.engine("static"), req.prompts, req.params, solo=True)
    return completion.reply(seqs, req, single=True)


@bp.post("/generate_stream")
def generate_stream():
    return completion.stream(completion.engine("static"), schema.from_request(single=True))
