"""benchmarks/lora_vs_full.py: the phases it reads from rlx's per-step metrics and the bound it prints beside LoRA's
measured step (generation unchanged, 2/3 of the update, no optimizer step over frozen weights)."""

import pytest

from benchmarks.lora_vs_full import lora_bound, summarise


def _run(step, generation, optimizer, tokens, peak):
    return {"step_times": step, "generation_times": generation, "optimizer_times": optimizer, "tokens": tokens,
            "peak_mib": peak}


def test_summary_takes_medians_and_leaves_the_optimizer_out_of_the_update():
    runs = [_run([10.0, 12.0, 11.0], [4.0, 4.0, 5.0], [0.3, 0.3, 0.3], [400, 440, 420], 6000),
            _run([13.0, 13.0, 14.0], [5.0, 5.0, 5.0], [0.5, 0.5, 0.5], [390, 390, 390], 6200)]
    s = summarise(runs)
    assert s["step_s"] == pytest.approx(12.0)        # median of the runs' medians 11 and 13
    assert s["generation_s"] == pytest.approx(4.5)
    assert s["optimizer_s"] == pytest.approx(0.4)
    assert s["update_s"] == pytest.approx(12.0 - 4.5 - 0.4)
    assert s["tokens_per_s"] == pytest.approx((420 / 11 + 390 / 13) / 2)
    assert s["peak_mib"] == pytest.approx(6100)


def test_bound_keeps_generation_and_two_thirds_of_the_update():
    full = {"generation_s": 4.0, "update_s": 6.0, "optimizer_s": 0.3}
    assert lora_bound(full) == pytest.approx(4.0 + 4.0)  # no optimizer over frozen weights, weight gradients gone


def test_framework_ratio_times_the_plain_model_then_the_same_model_with_adapters(tmp_path, monkeypatch):
    """transformers' own forward + backward, plain then with LoRA: both timed on the same tokens, the ratio theirs;
    the adapters really wrap the model for the second timing (peft's LoRA layers run in its forward)."""
    import torch
    from peft.tuners.lora.layer import Linear
    from transformers import LlamaConfig, LlamaForCausalLM

    from benchmarks import lora_vs_full

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
                     ).save_pretrained(tmp_path)
    calls = {"lora": 0}
    original = Linear.forward

    def counting(self, *args, **kwargs):
        calls["lora"] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Linear, "forward", counting)
    out = lora_vs_full.framework_ratio(tmp_path, threads=1, rows=4, prompt_tokens=6, completion_tokens=5, repeats=2)
    assert out["full_s"] > 0 and out["lora_s"] > 0 and out["ratio"] == pytest.approx(out["lora_s"] / out["full_s"])
    assert (out["rows"], out["prompt_tokens"], out["completion_tokens"]) == (4, 6, 5)
    assert calls["lora"] == 3 * 2 * 7  # warm-up + 2 timed passes x 2 layers x 7 adapted linears


def test_lora_memory_worker_trains_what_it_is_given(tmp_path):
    """benchmarks/lora_memory.py's worker, plain and with LoRA: per step a time and the peak RSS so far (never
    falling)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from benchmarks.lora_memory import worker

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
                     ).save_pretrained(tmp_path)
    for lora in (False, True):
        out = worker(str(tmp_path), lora, threads=1, rows=4, prompt_tokens=6, completion_tokens=5, steps=3)
        assert len(out["step_times"]) == 3 and all(t > 0 for t in out["step_times"])
        assert out["peak_mib_by_step"] == sorted(out["peak_mib_by_step"]) and out["peak_mib_by_step"][0] > 0
