"""8-bit rollouts (rollout.quantize=int8): the int8 weights by hand, a decode step that is really int8 and near the
float32 one, behaviour log-probs that are the 8-bit sampler's (and so what the correction weighs), an 8-bit copy
re-made after every update, refusals, and a run that logs the gap and resumes exactly."""

import shutil

import pytest
import torch

from rlx.config.overrides import check_overrides
from rlx.engines import fast_decode
from rlx.engines.fast_decode import decode_step_for, int8_linear, int8_matmul
from rlx.engines.generator import DecodeStep, HFGenerator
from rlx.errors import UserError
from rlx.runtime.rundir import read_metrics
from tests.conftest import only_run_dir, run_rlx


def test_int8_weights_by_hand():
    weight = torch.tensor([[0.5, -1.0, 0.25], [0.0, 0.0, 0.0], [2.0, 1.0, -0.5]])
    packed = int8_linear(weight, torch.tensor([0.1, 0.2, 0.3]))
    assert weight.tolist() == [[0.5, -1.0, 0.25], [0.0, 0.0, 0.0], [2.0, 1.0, -0.5]]  # the policy's own, untouched
    q, _ = torch.ops.quantized.linear_unpack(packed[0])
    # per output channel: s_c = max|W_c| / 127, q = round(W / s_c); two zero columns for the range (+1, -1)
    assert q.int_repr().tolist() == [[64, -127, 32, 0, 0], [0, 0, 0, 0, 0], [127, 64, -32, 0, 0]]
    assert q.q_per_channel_scales().tolist() == pytest.approx([1.0 / 127, 1e-12, 2.0 / 127])
    assert packed[1].tolist() == pytest.approx([0.1, 0.2, 0.3])
    x = torch.tensor([[1.0, 2.0, 3.0], [-30.0, 0.5, 0.0]])
    want = x @ q.dequantize()[:, :3].T + packed[1]
    got = int8_matmul(x, packed)
    assert got == pytest.approx(want, rel=0.02, abs=0.02 * 30)
    # each row alone: the same numbers, whatever else is in the batch (the activation range is pinned per row)
    assert torch.equal(int8_matmul(x[:1], packed), got[:1]) and torch.equal(int8_matmul(x[1:], packed), got[1:])


@pytest.fixture(scope="module")
def tiny():
    from rlx.config.paths import ASSETS_DIR
    from rlx.models.loading import load_causal_lm, load_tokenizer

    return load_causal_lm(str(ASSETS_DIR / "tiny")).eval(), load_tokenizer(str(ASSETS_DIR / "tiny"))


def _prompts():
    g = torch.Generator().manual_seed(0)
    return [torch.randint(5, 200, (n,), generator=g).tolist() for n in (6, 9, 4)]


def _replay(model, prompt, tokens, quantize):
    """log p of `tokens` after `prompt` as the sampler computes them: the prompt through the model's forward (the
    first token's logits), every later token through rlx's decode step with `quantize` weights."""
    from rlx.engines.hf import generation_cache

    cache = generation_cache(model, len(tokens))
    ids = torch.tensor([prompt])
    out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    step = decode_step_for(model, quantize=quantize)
    logits, values = out.logits[:, -1], []
    attention = torch.ones(1, len(prompt), dtype=torch.long)
    for t, token in enumerate(tokens):
        values.append(torch.log_softmax(logits.float(), -1)[0, token].item())
        attention = torch.cat([attention, attention.new_ones(1, 1)], dim=1)
        logits = step(torch.tensor([token]), torch.tensor([len(prompt) + t]), attention, out.past_key_values)
    return values


def _draw(model, tokenizer, quantize, seeds=(1, 2, 3)):
    generator = HFGenerator(model, tokenizer, temperature=1.0, logprobs="sampler", decode=DecodeStep(quantize=quantize))
    return generator.generate_ids(_prompts(), max_new_tokens=8, seeds=list(seeds))


@torch.no_grad()
def test_the_behaviour_logprobs_are_the_8bit_samplers(tiny):
    model, tokenizer = tiny
    out = _draw(model, tokenizer, "int8")
    fp32_gap = 0.0
    for prompt, tokens, logprobs in zip(_prompts(), out.ids, out.logprobs):
        # one row alone: the int8 products are the same, the float attention of another batch size rounds apart
        assert logprobs == pytest.approx(_replay(model, prompt, tokens, "int8"), abs=5e-4)
        fp32 = _replay(model, prompt, tokens, "none")
        assert logprobs[0] == pytest.approx(fp32[0], abs=1e-5)  # the first token: the float32 prefill's logits
        fp32_gap = max(fp32_gap, max(abs(a - b) for a, b in zip(logprobs[1:], fp32[1:])))
    assert 5e-3 < fp32_gap < 0.5  # a nearby policy, not the float32 one: swapping the two would fail above


@torch.no_grad()
def test_int8_layers_keeps_the_head_float_and_its_logprobs_are_the_samplers(tiny):
    """rollout.quantize=int8_layers: every projection from the int8 copy, the output head float32; the sampler's
    log-probs are that policy's (a one-row replay), nearer float32 than the all-int8 step's and not equal to it."""
    model, tokenizer = tiny
    step = decode_step_for(model, quantize="int8_layers")
    attn = model.model.layers[0].self_attn
    assert id(attn.q_proj) in step.quantized and id(model.lm_head) not in step.quantized
    out = _draw(model, tokenizer, "int8_layers")
    from_fp32 = from_int8 = 0.0
    for prompt, tokens, logprobs in zip(_prompts(), out.ids, out.logprobs):
        assert logprobs == pytest.approx(_replay(model, prompt, tokens, "int8_layers"), abs=5e-4)
        fp32, int8 = _replay(model, prompt, tokens, "none"), _replay(model, prompt, tokens, "int8")
        from_fp32 = max(from_fp32, max(abs(a - b) for a, b in zip(logprobs[1:], fp32[1:])))
        from_int8 = max(from_int8, max(abs(a - b) for a, b in zip(logprobs[1:], int8[1:])))
    assert from_fp32 > 5e-3 and from_int8 > 5e-4  # neither the float32 policy nor the all-int8 one


@torch.no_grad()
def test_the_8bit_copy_is_made_again_from_the_weights_of_every_call(tiny, monkeypatch):
    model, tokenizer = tiny
    seen = []
    pack = fast_decode.int8_linear
    monkeypatch.setattr(fast_decode, "int8_linear", lambda w, b: seen.append(w.detach().clone()) or pack(w, b))
    _draw(model, tokenizer, "int8")
    first = [w for w in seen]
    head = model.lm_head.weight
    saved = head.detach().clone()
    try:
        head.add_(0.01)  # an update
        seen.clear()
        _draw(model, tokenizer, "int8")
    finally:
        head.copy_(saved)
    assert len(seen) == len(first) and any(not torch.equal(a, b) for a, b in zip(seen, first))
    assert any(torch.equal(w, saved + 0.01) for w in seen)


def test_int8_rollouts_are_refused_where_they_do_not_run():
    from rlx.config.rules import check_quantized_rollout
    from rlx.config.settings import checked_settings

    lora_server = ["rollout=server", "rollout.quantize=int8", "model.lora.enabled=true"]
    for overrides, needle in ((["hardware=gpu", "rollout.quantize=int8"], "on the CPU only"),
                              (["rollout=server", "rollout.quantize=fp8"], "on CUDA only"),
                              (["rollout=server", "rollout.quantize=int8_layers"], "set rollout.quantize=int8$"),
                              ([*lora_server], "set rollout.server.lora_push=merged$"),
                              (["rollout=server", "rollout.quantize=int8", "rollout.server.publisher=lora"],
                               "set rollout.server.publisher=file$"),
                              (["rollout.quantize=fp8"], "rollout=hf takes int8 or int8_layers"),
                              (["rollout=vllm", "rollout.quantize=fp8"], "on CUDA only"),
                              (["rollout=vllm", "rollout.quantize=int8_layers"], "set rollout.quantize=int8$")):
        with pytest.raises(UserError, match=needle):
            check_quantized_rollout(checked_settings(check_overrides(overrides)))
    for runs in (["rollout=vllm", "rollout.quantize=int8"], ["rollout=vllm", "hardware=gpu", "rollout.quantize=int8"],
                 ["rollout=vllm", "hardware=gpu", "rollout.quantize=fp8"], ["rollout=server", "rollout.quantize=int8"],
                 [*lora_server, "rollout.server.lora_push=merged"],
                 ["rollout=server", "hardware=gpu", "rollout.quantize=fp8"]):
        check_quantized_rollout(checked_settings(check_overrides(runs)))  # vLLM's 8-bit modes (engines/vllm_quant.py)


def test_a_model_without_rlx_decode_step_is_refused_before_generating():
    from transformers import GPT2Config, GPT2LMHeadModel

    from rlx.engines.generator import check_quantized_decoding

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50))
    with pytest.raises(UserError, match="this model is gpt2"):
        check_quantized_decoding(model, "int8")


def test_an_int8_run_logs_the_gap_corrects_it_and_resumes_exactly(tmp_path):
    args = ["train", "steps=3", "rollout.quantize=int8", "rollout.correction=tis", "hardware.num_threads=1",
            "checkpoint.every=1"]
    (tmp_path / "straight").mkdir()
    straight = run_rlx(args, tmp_path / "straight", timeout=600)
    assert straight.returncode == 0, straight.stderr[-3000:]
    run = only_run_dir(tmp_path / "straight")
    rows = read_metrics(run / "metrics.jsonl")
    trained = [row for row in rows if row["step"] > 0]  # (step 0: the evaluation before training)
    assert len(trained) == 3
    assert all(row["rollout/logprob_gap_mean"] > 0 for row in trained)  # the sampler is not the float32 policy
    assert all(row["rollout/tis_weight_mean"] != 1.0 for row in trained)  # and the correction weighs that gap
    resumed_run = tmp_path / "resumed" / run.name
    shutil.copytree(run, resumed_run)
    shutil.rmtree(resumed_run / "checkpoints" / "step_000003")
    (resumed_run / "result.json").unlink()
    resumed = run_rlx(["train", f"resume={resumed_run}"], tmp_path / "resumed", timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    strip = lambda rs: [{k: v for k, v in r.items() if not k.startswith("perf/") and k != "time"} for r in rs]  # noqa: E731
    assert strip(read_metrics(resumed_run / "metrics.jsonl")) == strip(rows)


def test_auto_decides_int8_with_tis_where_the_copy_pays_and_none_elsewhere(tiny):
    """rollout.quantize=auto (the default): int8 + TIS on the CPU with rlx's decoder for completions of >= 128
    tokens; float32 elsewhere, and an explicit choice is kept as it is."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from rlx.config.settings import checked_settings
    from rlx.engines.generator import AUTO_INT8_MIN_TOKENS, resolved_rollout

    def decided(overrides, model=tiny[0]):
        roll = resolved_rollout(checked_settings(check_overrides(overrides)), model).rollout
        return roll.quantize, roll.correction

    budget = f"rollout.max_new_tokens={AUTO_INT8_MIN_TOKENS}"
    assert checked_settings(check_overrides([])).rollout.quantize == "auto"
    assert decided([budget]) == ("int8", "tis")
    assert decided([budget, "rollout.correction=mis"]) == ("int8", "mis")  # a correction the user chose stays
    assert decided([f"rollout.max_new_tokens={AUTO_INT8_MIN_TOKENS - 1}"]) == ("none", "none")  # the default run
    assert decided([budget, "rollout.quantize=none"]) == ("none", "none")
    assert decided([budget, "rollout.quantize=int8"]) == ("int8", "none")  # explicit: uncorrected, as asked
    assert decided([budget, "hardware=gpu"]) == ("none", "none")
    assert decided([budget, "hardware=fsdp"]) == ("none", "none")
    assert decided(["rollout=vllm", budget]) == ("none", "none")
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50))
    assert decided([budget], gpt2) == ("none", "none")  # no rlx decode step: float32, no error


def test_a_default_run_with_long_completions_samples_from_int8_and_corrects(tmp_path):
    result = run_rlx(["train", "steps=1", "rollout.max_new_tokens=128", "hardware.num_threads=1", "eval.every=0",
                      "eval.at_start=false", "save.final=false"], tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rollout.quantize=auto -> int8" in result.stderr + result.stdout
    (row,) = [r for r in read_metrics(only_run_dir(tmp_path) / "metrics.jsonl") if r["step"] > 0]
    assert row["rollout/logprob_gap_mean"] > 0 and "rollout/tis_weight_mean" in row
