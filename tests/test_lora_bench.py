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
