"""The shipped tiny model is rebuilt by the tiny_sft recipe, deterministically."""

import json

import pytest
import torch
from safetensors.torch import load_file

from rlx.config.paths import ASSETS_DIR
from rlx.runtime.rundir import read_metrics
from tests.conftest import only_run_dir, run_rlx


def _build(tmp_path, name, *extra):
    out = tmp_path / name
    out.mkdir()
    result = run_rlx(["train", "tiny_sft", *extra], out)
    assert result.returncode == 0, result.stderr[-3000:]
    return only_run_dir(out)


def test_tiny_sft_rebuild_is_deterministic_and_matches_shipped_tokenizer(tmp_path):
    fast = ["steps=3", "eval.size=4", "eval.every=3", "save.plot=false"]
    a, b = _build(tmp_path, "a", *fast), _build(tmp_path, "b", *fast)
    wa, wb = load_file(a / "final" / "model.safetensors"), load_file(b / "final" / "model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    # the tokenizer is trained from the task's text before any SFT: identical to the shipped one
    shipped = json.loads((ASSETS_DIR / "tiny" / "tokenizer.json").read_text())
    assert json.loads((a / "final" / "tokenizer.json").read_text())["model"] == shipped["model"]
    config = json.loads((a / "final" / "config.json").read_text())
    assert config["model_type"] == "llama" and sum(v.numel() for v in wa.values()) < 5_000_000


SHIPPED_ACCURACY = 0.32  # held-out greedy accuracy of the shipped model, as written by `make tiny-model`
PARTIAL_SKILL = (0.2, 0.6)  # the recipe's goal: the task learned, room left for RL (CPU kernels move the exact value)


@pytest.mark.long
def test_full_tiny_sft_reproduces_the_shipped_model(tmp_path):
    # On the machine that built the asset the rebuild is bitwise identical. Another CPU may use other
    # matmul kernels, and float rounding then moves this early-stopped SFT: measured 0.32 on the build machine
    # and 0.52 on an AVX2 AMD EPYC, same code and seed. The check is that the rebuild lands on partial skill
    # (learned the task, room left for RL: PARTIAL_SKILL) with the shipped model's shapes (the weight gap is
    # printed: 0 on the build machine).
    run = _build(tmp_path, "full")
    final = [r for r in read_metrics(run / "metrics.jsonl") if "eval/accuracy" in r][-1]["eval/accuracy"]
    low, high = PARTIAL_SKILL
    assert low <= SHIPPED_ACCURACY <= high
    assert low <= final <= high, (f"rebuilt model accuracy {final} is not partial skill {PARTIAL_SKILL} (shipped "
                                  f"{SHIPPED_ACCURACY})")
    built, shipped = (load_file(run / "final" / "model.safetensors"),
                      load_file(ASSETS_DIR / "tiny" / "model.safetensors"))
    assert {k: v.shape for k, v in built.items()} == {k: v.shape for k, v in shipped.items()}
    gap = max((built[k] - shipped[k]).abs().max().item() for k in built)
    print(f"largest weight difference to the shipped model: {gap:.3g}")


AGENT_SHIPPED_SUCCESS = 0.42  # eval/success of the shipped agent warm start (mixture, 50 held-out episodes)


@pytest.mark.long
def test_full_tiny_agent_sft_reproduces_the_shipped_warm_start(tmp_path):
    # 2.5-5 min on the shared 2-core machine. `rlx train tiny_agent_sft` (one thread, as the recipe sets)
    # rebuilt builtin:tiny_agent bit for bit on the machine that built it (weight gap 0.0, eval/success 0.42,
    # twice). As for tiny_sft, another CPU's kernels may move the numbers: the check is partial skill with
    # the shipped shapes, and the gap is printed.
    out = tmp_path / "agent"
    out.mkdir()
    result = run_rlx(["train", "tiny_agent_sft", "save.plot=false", "log.progress=false"], out)
    assert result.returncode == 0, result.stderr[-3000:]
    run = only_run_dir(out)
    final = [r for r in read_metrics(run / "metrics.jsonl") if "eval/success" in r][-1]["eval/success"]
    assert 0.2 <= final <= 0.6, (f"rebuilt warm start success {final} is not partial skill (shipped "
                                 f"{AGENT_SHIPPED_SUCCESS})")
    built = load_file(run / "final" / "model.safetensors")
    shipped = load_file(ASSETS_DIR / "tiny_agent" / "model.safetensors")
    assert {k: v.shape for k, v in built.items()} == {k: v.shape for k, v in shipped.items()}
    gap = max((built[k] - shipped[k]).abs().max().item() for k in built)
    print(f"largest weight difference to the shipped warm start: {gap:.3g}")
