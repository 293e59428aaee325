"""Real `rlx train` subprocesses on the built-in tiny model for a couple of steps."""

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlx.config.paths import ASSETS_DIR
from rlx.runtime.rundir import read_metrics
from tests.conftest import only_run_dir, run_rlx

FAST = ["steps=2", "prompts_per_step=2", "rollout.samples_per_prompt=4", "eval.size=8", "eval.every=1",
        "log.samples_every=1"]


def test_grpo_two_steps_writes_run_directory_and_changes_parameters(tmp_path):
    # 4 groups of 8: with the shipped model's ~0.3 sample accuracy some group has mixed rewards (a
    # non-zero advantage), which 2 groups of 4 may not have
    result = run_rlx(["train", *FAST, "prompts_per_step=4", "rollout.samples_per_prompt=8"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run = only_run_dir(tmp_path)
    for name in ("config.yaml", "overrides.yaml", "metrics.jsonl", "train.log", "plots/reward.png",
                 "samples/step_000001.jsonl", "final/model.safetensors", "final/tokenizer.json"):
        assert (run / name).exists(), name
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    for key in ("reward/total", "reward/task", "reward/format", "reward/accuracy", "train/loss", "train/entropy",
                "train/clip_frac_low", "completions/mean_length", "perf/tokens_per_s", "perf/step_time_s"):
        assert key in rows[1], key
    assert "eval/accuracy" in rows[0] and "eval/accuracy" in rows[2]
    for row in rows[1:]:  # the per-phase profile: disjoint parts of the step, the optimizer inside the update
        phases = [row[f"perf/{p}_time_s"] for p in ("generation", "logprob", "update")]
        assert min(phases) >= 0 and sum(phases) <= row["perf/step_time_s"]
        assert 0 < row["perf/optimizer_time_s"] < row["perf/update_time_s"]
    assert "steps=2" in (run / "overrides.yaml").read_text()
    before = load_file(ASSETS_DIR / "tiny" / "model.safetensors")
    after = load_file(run / "final" / "model.safetensors")
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert changed, "no parameter changed after two GRPO steps"
    # the saved model reloads with plain transformers and generates
    tok = AutoTokenizer.from_pretrained(run / "final")
    model = AutoModelForCausalLM.from_pretrained(run / "final")
    text = tok.apply_chat_template([{"role": "user", "content": "State the final answer: 1 + 2 ="}], tokenize=False,
                                   add_generation_prompt=True)
    out = model.generate(**tok(text, return_tensors="pt"), max_new_tokens=6, do_sample=False)
    assert out.shape[1] > len(tok(text)["input_ids"])


def test_same_seed_same_metrics(tmp_path):
    metrics = []
    for i in range(2):
        out = tmp_path / f"r{i}"
        out.mkdir()
        result = run_rlx(["train", *FAST, "seed=5", "save.final=false", "save.plot=false"], out)
        assert result.returncode == 0, result.stderr[-3000:]
        rows = read_metrics(only_run_dir(out) / "metrics.jsonl")
        metrics.append([{k: v for k, v in r.items() if not k.startswith("perf/") and k != "time"} for r in rows])
    assert metrics[0] == metrics[1]


def test_sft_and_local_model_path(tmp_path):
    # SFT from the shipped model saved to a local directory (the model.path route)
    local = tmp_path / "local_model"
    AutoModelForCausalLM.from_pretrained(ASSETS_DIR / "tiny").save_pretrained(local)
    AutoTokenizer.from_pretrained(ASSETS_DIR / "tiny").save_pretrained(local)
    result = run_rlx(["train", "algorithm=sft", f"model.path={local}", "steps=2", "algorithm.batch_size=4",
                      "eval.size=4", "eval.every=1"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run = only_run_dir(tmp_path)
    rows = read_metrics(run / "metrics.jsonl")
    assert rows[-1]["step"] == 2 and rows[-1]["train/loss"] > 0
    config = (run / "config.yaml").read_text()
    assert str(local) in config


def test_missing_local_model_is_one_line(tmp_path):
    result = run_rlx(["train", "model.path=./does/not/exist", "steps=1"], tmp_path, timeout=120)
    assert result.returncode == 2
    assert "not a directory" in result.stderr and "Traceback" not in result.stderr


def test_reward_error_shows_offending_completion(tmp_path):
    broken = ["+reward.components.broken._target_=tests.helpers.broken_reward", "+reward.components.broken.weight=1.0"]
    env = {}
    result = run_rlx(["train", *FAST, *broken], tmp_path, env_extra=env)
    assert result.returncode == 1
    assert "reward 'broken' raised RuntimeError: checker crashed on completion '" in result.stderr
    assert "Traceback" not in result.stderr
    zero = run_rlx(["train", *FAST, *broken, "reward.on_error=zero", "save.final=false"], tmp_path, env_extra=env)
    assert zero.returncode == 0, zero.stderr[-2000:]
    rows = read_metrics(sorted((tmp_path / "outputs" / "train").iterdir())[-1] / "metrics.jsonl")
    assert rows[1]["reward/errors"] == 8  # every completion of the step failed and was scored 0
