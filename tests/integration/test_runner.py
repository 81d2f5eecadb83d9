"""The model itself, on the real default model: left padding, per-row parameters, detokenizing."""

import copy
import queue

import pytest

from batcher.sampling import SamplingParams
from batcher.sequence import Sequence
from batcher.static.runner import RoundRows
from tests.helpers.workers import PROMPTS, run


def greedy(prompt, max_tokens=20, **kw):
    return Sequence(prompt, SamplingParams(max_tokens=max_tokens), **kw)


def test_the_capital_of_france_is_paris(runner_fp32):
    [(text, reason)] = run(runner_fp32, [greedy("The capital of France is")])
    assert text.startswith(" Paris.")
    assert reason == "length"


def test_on_a_cpu_the_linears_are_packed_and_give_transformers_own_logits(runner_fp32):
    """batcher/static/linear.py: every linear runs oneDNN on a packed weight, and the model's
    logits over a padded batch are those of the model as transformers loads it, to fp32 rounding."""
    import torch
    from transformers import AutoModelForCausalLM

    from batcher.static.linear import PackedLinear

    if runner_fp32.device != "cpu":
        pytest.skip("linears are packed on a CPU only")
    linears = [m for m in runner_fp32.model.modules() if isinstance(m, torch.nn.Linear | PackedLinear)]
    assert linears and all(isinstance(m, PackedLinear) for m in linears), {type(m) for m in linears}
    plain = AutoModelForCausalLM.from_pretrained(runner_fp32.settings.model_path, dtype=torch.float32).eval()
    inputs = runner_fp32.encode(PROMPTS)
    with torch.inference_mode():
        packed_logits, plain_logits = runner_fp32.model(**inputs).logits, plain(**inputs).logits
    real = inputs["attention_mask"].bool()
    assert torch.allclose(packed_logits[real], plain_logits[real], atol=1e-3, rtol=0), (
        (packed_logits[real] - plain_logits[real]).abs().max()
    )
    assert (packed_logits[real].argmax(-1) == plain_logits[real].argmax(-1)).all()


def test_fp16_weights_computed_in_fp32_read_fp16_when_narrow_and_packed_fp32_when_wide():
    """batcher/static/linear.py's half_weights (fp16 where oneDNN cannot pack it): every parameter
    holds fp16's values; a call of fewer than FP16_BELOW rows (a narrow decode step) runs torch's
    fp16 kernel on them, a wider one (a round of 4, a prefill: rows x positions) oneDNN on the same
    values packed in fp32; either way the model's activations stay fp32."""
    import torch

    from batcher.static.linear import FP16_BELOW, HalfWeightLinear, half_weights

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Linear(96, 32, bias=False))
    rounded = copy.deepcopy(model).half()
    done = half_weights(model, 4)
    assert done == f"fp16 weights computed in fp32: 2 linears read fp16 under {FP16_BELOW} rows, packed fp32 from there"
    assert all(isinstance(layer, HalfWeightLinear) for layer in model)
    assert torch.equal(model[0].weight, rounded[0].weight) and torch.equal(model[0].bias, rounded[0].bias)
    narrow = torch.randn(FP16_BELOW - 1, 1, 64)  # a decode step: one position per row
    wide = torch.randn(2, FP16_BELOW, 64)  # a prefill: rows x positions
    with torch.inference_mode():
        assert torch.equal(model[0](narrow), rounded[0](narrow.half()).float())
        out = model[0](wide)
        assert out.dtype == torch.float32
        assert torch.equal(out, model[0].wide(wide))  # the packed fp32 copy
        same_values = torch.nn.functional.linear(wide, rounded[0].weight.float(), rounded[0].bias.float())
        assert torch.allclose(out, same_values, atol=1e-5, rtol=1e-5), (out - same_values).abs().max()
        assert model(narrow).dtype == model(wide).dtype == torch.float32


def test_greedy_output_is_the_same_alone_and_in_a_padded_batch(runner_fp32):
    alone = [run(runner_fp32, [greedy(p)])[0][0] for p in PROMPTS]
    batch = [text for text, _ in run(runner_fp32, [greedy(p) for p in PROMPTS])]
    assert runner_fp32.encode(PROMPTS)["attention_mask"][1].tolist()[0] == 0  # "Hi" is left-padded
    assert batch == alone


def test_max_tokens_is_per_prompt_inside_one_round(runner_fp32):
    short, long = greedy("Once upon a time", max_tokens=5), greedy("Once upon a time", max_tokens=50)
    (short_text, short_reason), (long_text, _) = run(runner_fp32, [short, long])
    assert len(short.token_ids) <= 5 and short_reason == "length"
    assert len(long.token_ids) > 5
    assert long_text.startswith(short_text)


def test_a_greedy_prompt_stays_greedy_next_to_a_sampled_one(runner_fp32):
    [(alone, _)] = run(runner_fp32, [greedy(PROMPTS[2])])
    sampled = Sequence(PROMPTS[3], SamplingParams(max_tokens=20, temperature=1.5, top_p=0.95))
    (mixed, _), (sampled_text, _) = run(runner_fp32, [greedy(PROMPTS[2]), sampled])
    assert mixed == alone
    assert sampled_text  # the sampled row produced text of its own


def test_an_over_long_prompt_is_never_cut_by_the_runner(runner_fp32):
    """The service refuses one, or cuts it as the request asks (tests/integration/test_context.py); one that
    reaches the runner anyway fails its row (a ValueError in its tokenization), never cut."""
    short_window = copy.copy(runner_fp32)
    short_window.max_input_tokens = 4
    with pytest.raises(ValueError, match="more than MAX_INPUT_TOKENS=4"):
        short_window.tokenize("one two three four five six seven eight nine ten")
    with pytest.raises(ValueError, match="more than MAX_INPUT_TOKENS=4"):
        short_window.tokenize(tuple(range(5)))
    assert short_window.tokenize("one two") == runner_fp32.tokenizer("one two")["input_ids"]


def test_streamed_pieces_join_into_the_decoded_text_without_broken_characters(runner_fp32):
    import torch

    tokenizer = runner_fp32.tokenizer
    text = " 안녕하세요, 세계! Ünïcödé – naïve café 😀 done"
    ids = tokenizer.encode(text, add_special_tokens=False)
    seq = Sequence("x", SamplingParams(max_tokens=len(ids) + 1), pieces=queue.SimpleQueue())
    rows = RoundRows([seq], tokenizer, runner_fp32.eos_ids)
    for token in ids:  # one decoding step at a time, as generate() calls the streamer
        rows.put(torch.tensor([token]))
    rows.finish(0)
    final = seq.text
    pieces = []
    while not seq.pieces.empty():
        _, piece = seq.pieces.get()
        if piece is not None:
            pieces.append(piece)
    assert "".join(pieces) == final == tokenizer.decode(ids)
    assert not any("\ufffd" in piece for piece in pieces)
    assert len(pieces) > 5  # it really streamed, piece by piece


def test_eos_ends_a_row_with_reason_stop(runner_fp32):
    import torch

    seq = greedy("x", max_tokens=10)
    rows = RoundRows([seq], runner_fp32.tokenizer, runner_fp32.eos_ids)
    rows.put(torch.tensor([runner_fp32.tokenizer.encode(" Paris")[0]]))
    rows.put(torch.tensor([next(iter(runner_fp32.eos_ids))]))
    assert rows(torch.zeros(1, 1), None).tolist() == [True]
    assert (rows.finish(0), seq.text) == ("stop", " Paris")


def test_ignore_eos_generates_exactly_max_tokens(runner_fp32):
    prompt = "Write one sentence about the sea."
    [(_, reason)] = run(runner_fp32, [greedy(prompt, max_tokens=20)])
    natural = greedy(prompt, max_tokens=20)
    run(runner_fp32, [natural])
    forced = Sequence(prompt, SamplingParams(max_tokens=20, ignore_eos=True))
    (_, forced_reason), (_, other_reason) = run(runner_fp32, [forced, greedy(prompt, max_tokens=20)])
    assert reason == other_reason == "stop" and len(natural.token_ids) < 20  # this prompt ends early
    assert len(forced.token_ids) == 20 and forced_reason == "length"


def test_our_generate_gives_transformers_own_greedy_tokens_over_a_padded_batch(runner_fp32):
    """batcher/static/decode.py stands in for transformers' generate(): over the same left-padded
    batch, greedy, it picks the same tokens, row by row, up to each row's EOS."""
    import torch

    seqs = [greedy(p, max_tokens=24) for p in PROMPTS]
    inputs = runner_fp32.encode(PROMPTS)
    runner_fp32.generate(seqs, inputs)
    pad = runner_fp32.tokenizer.pad_token_id
    with torch.inference_mode():
        theirs = runner_fp32.model.generate(**inputs, max_new_tokens=24, do_sample=False, pad_token_id=pad)
    for seq, row in zip(seqs, theirs[:, inputs["input_ids"].shape[1] :].tolist(), strict=True):
        ends = [i for i, token in enumerate(row) if token in runner_fp32.eos_ids]
        assert seq.token_ids == row[: ends[0] + 1 if ends else None]


def test_a_round_runs_the_model_once_a_token_and_no_step_after_its_last_row_ends(runner_fp32):
    """One prefill, then one step a token until the last row's last token: none after it (a row
    ended by a stop string used to cost the round one more: transformers' generate() asked its
    stopping criteria before handing them the step's tokens)."""
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    paris = runner_fp32.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    seqs = [Sequence(paris, SamplingParams(max_tokens=64, stop=("Paris",))), greedy("Hi", max_tokens=3)]
    calls = []
    hook = runner_fp32.model.register_forward_hook(lambda *args: calls.append(1))
    try:
        reasons = runner_fp32.generate(seqs, runner_fp32.encode([s.prompt for s in seqs]))
    finally:
        hook.remove()
    assert reasons == ["stop", "length"] and seqs[0].text == "The capital of France is "  # its stop string
    assert len(calls) == len(seqs[0].token_ids)


def test_top_p_draws_from_the_likeliest_tokens_that_reach_it_and_at_one_from_every_token():
    """PerRowSampling, seeded rows: top_p 0.5 keeps the one token that reaches it; top_p 1 (the
    default, which sorts nothing) keeps all three, alone in its round or beside a row that sorts."""
    import torch

    from batcher.static.processors import PerRowSampling

    def drawn(top_ps: list[float]) -> list[set[int]]:
        seen = [set() for _ in top_ps]
        for seed in range(200):
            seqs = [Sequence("x", SamplingParams(max_tokens=1, temperature=1.0, top_p=p, seed=seed)) for p in top_ps]
            scores = torch.tensor([[0.6, 0.3, 0.1]] * len(top_ps)).log()
            kept = PerRowSampling(seqs, "cpu")(None, scores)
            for row, tokens in enumerate(seen):
                tokens.add(int(kept[row].argmax()))
        return seen

    assert drawn([1.0]) == [{0, 1, 2}]
    assert drawn([0.5, 1.0]) == [{0}, {0, 1, 2}]
