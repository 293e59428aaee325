"""Real `rlx train` / `rlx data prefs` subprocesses for the preference and reward-model families,
the reward=model source, and the ensemble aggregation (hand-derived)."""

import json
import re

import pytest
import torch

from rlx.config.settings import checked_settings
from rlx.rewards.model import aggregate_ensemble
from rlx.runtime.rundir import read_metrics
from tests.conftest import only_run_dir, run_rlx

# 2 steps of 4 pairs; 8 held-out pairs; 4 held-out task prompts
PREF_FAST = ["data=prefs", "steps=2", "algorithm.batch_size=4", "micro_batch_size=2", "data.pairs.eval_size=8",
             "eval.size=4", "eval.every=1", "save.plot=false", "hardware.num_threads=1", "data.train_size=300"]


@pytest.fixture(scope="module")
def small_pairs(tmp_path_factory):
    """24 embedded pairs in a file, so reference precomputation stays short."""
    from rlx.data.preferences import ASSETS

    path = tmp_path_factory.mktemp("pairs") / "pairs.jsonl"
    path.write_text("".join((ASSETS / "chain_sum_prefs.jsonl").read_text().splitlines(keepends=True)[:24]))
    return path


def _check_preference_run(run, pairs=24):
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    for key in ("train/loss", "pref/accuracy", "pref/margin", "pref/chosen_logp", "pref/rejected_logp",
                "pref/chosen_reward", "pref/rejected_reward", "perf/tokens_per_s"):
        assert key in rows[1], key
    for key in ("eval/pref_accuracy", "eval/accuracy"):
        assert key in rows[0] and key in rows[2], key
    assert rows[0]["data/pairs"] == pairs
    assert (run / "final" / "model.safetensors").exists()
    return rows


def test_dpo_two_steps_caches_reference_logps(tmp_path, small_pairs):
    result = run_rlx(["train", "algorithm=dpo", *PREF_FAST, f"data.pairs.path={small_pairs}"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run = only_run_dir(tmp_path)
    rows = _check_preference_run(run)
    cached = torch.load(run / "reference_logps.pt")
    # 24 pairs; held-out prompts cover at least 8 of them (a prompt can have several pairs), 8 are kept
    assert cached["eval"].shape == (8, 2) and cached["train"].shape[1] == 2 and 14 <= cached["train"].shape[0] <= 16
    # only the 2 x 4 pairs the run draws were scored (a real model's short run need not score thousands); NaN: the rest
    assert int((~cached["train"].isnan().any(dim=1)).sum()) == 8
    # step 0: policy == reference, every implicit reward is 0, the loss is log 2
    assert rows[0]["eval/pref_loss"] == pytest.approx(0.693147, abs=1e-5)
    assert rows[2]["eval/pref_loss"] != rows[0]["eval/pref_loss"]


@pytest.mark.parametrize("algorithm", ["simpo", "orpo"])
def test_reference_free_two_steps(tmp_path, small_pairs, algorithm):
    result = run_rlx(["train", f"algorithm={algorithm}", *PREF_FAST, f"data.pairs.path={small_pairs}"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run = only_run_dir(tmp_path)
    rows = _check_preference_run(run)
    assert not (run / "reference_logps.pt").exists()  # reference-free: no reference pass at all
    if algorithm == "orpo":  # ORPO adds the SFT term: the loss exceeds the odds-ratio term alone
        assert rows[1]["train/loss"] > rows[1]["train/pref_loss"]


def test_reward_model_then_reward_model_as_grpo_reward(tmp_path, small_pairs):
    rm = run_rlx(["train", "algorithm=reward_model", *PREF_FAST, f"data.pairs.path={small_pairs}"], tmp_path)
    assert rm.returncode == 0, rm.stderr[-3000:]
    rm_run = only_run_dir(tmp_path)
    rows = read_metrics(rm_run / "metrics.jsonl")
    for key in ("train/loss", "rm/accuracy", "rm/margin", "pref/accuracy", "perf/tokens_per_s"):
        assert key in rows[1], key
    assert 0.0 <= rows[-1]["eval/pref_accuracy"] <= 1.0
    config = json.loads((rm_run / "final" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForSequenceClassification"] and len(config["id2label"]) == 1

    # GRPO with the reward model (given as the run directory) mixed with the task checker
    policy_dir = tmp_path / "policy"
    policy_dir.mkdir()
    grpo = run_rlx(["train", "reward=model", f"reward.components.model.path={rm_run}",
                    "reward.components.task.weight=0.5",
                    "steps=2", "prompts_per_step=2", "rollout.samples_per_prompt=4", "eval.size=4", "eval.every=1",
                    "save.final=false", "save.plot=false", "data.train_size=300", "hardware.num_threads=1"], policy_dir)
    assert grpo.returncode == 0, grpo.stderr[-3000:]
    rows = read_metrics(only_run_dir(policy_dir) / "metrics.jsonl")
    # reward/total = 1.0 * model score + 0.5 * task score, per sample, so on the means too
    assert rows[1]["reward/total"] == pytest.approx(rows[1]["reward/model"] + 0.5 * rows[1]["reward/task"], abs=1e-5)
    assert "eval/accuracy" in rows[2]


@pytest.mark.parametrize("overrides,needle", [
    (["reward=model"], "reward.components.model.path"),
    (["algorithm=dpo"], "add data=prefs"),
    (["algorithm=dpo", "data=prefs", "algorithm.gamma=1.0"], "gamma (SimPO target margin) is only used by simpo"),
    (["algorithm=cdpo", "data=prefs", "algorithm.label_smoothing=0.7"], "label_smoothing <= 0.5"),
    (["algorithm=dpo", "data=prefs", "algorithm.reference=none"], "valid choices: precompute, model"),
])
def test_settings_mistakes_are_user_errors(overrides, needle):
    from rlx.config.overrides import check_overrides
    from rlx.config.rules import check_settings
    from rlx.errors import UserError

    with pytest.raises(UserError) as err:
        check_settings(checked_settings(check_overrides(overrides)))
    assert needle in str(err.value)


def test_rlx_data_prefs_on_a_few_prompts(tmp_path):
    out = tmp_path / "pairs.jsonl"
    result = run_rlx(["data", "prefs", f"out={out}", "prompts=12", "samples_per_prompt=6", "data.train_size=300",
                      "hardware.num_threads=1", "progress=true", "rollout.batch_size=12"], tmp_path,
                     env_extra={"FORCE_COLOR": "1"})  # rich draws as on a terminal
    assert result.returncode == 0, result.stderr[-3000:]
    pairs = [json.loads(line) for line in out.read_text().splitlines()]
    assert 0 < len(pairs) <= 12
    from rlx.rewards.rule import task_score

    for pair in pairs:
        assert set(pair) >= {"prompt", "chosen", "rejected", "answer"} and pair["chosen"] != pair["rejected"]
        # chosen is exactly right, rejected is not, by the task's own checker
        assert task_score(None, [pair["chosen"], pair["rejected"]], answer=[pair["answer"]] * 2) == [1.0, 0.0]
    assert f"wrote {len(pairs)} pairs" in result.stderr + result.stdout
    # the sampling phase has a bar, advanced chunk by chunk (12 prompts, 2 per chunk of 12 samples)
    drawn = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", result.stderr + result.stdout)
    assert "sampling completions 12/12" in drawn, drawn[-2000:]


def test_ensemble_aggregation_hand_values():
    # 3 reward models x 2 completions
    scores = torch.tensor([[1.0, 0.0],
                           [2.0, 0.0],
                           [3.0, 3.0]])
    # mean: (1+2+3)/3 = 2, (0+0+3)/3 = 1
    assert aggregate_ensemble(scores, "mean").tolist() == [2.0, 1.0]
    # worst case: min over models
    assert aggregate_ensemble(scores, "min").tolist() == [1.0, 0.0]
    # uncertainty, coef 0.5: var1 = ((1-2)^2 + 0 + (3-2)^2)/3 = 2/3 -> 2 - 1/3 = 1.666667
    #                        var2 = (1 + 1 + 4)/3 = 2               -> 1 - 1   = 0
    torch.testing.assert_close(aggregate_ensemble(scores, "uncertainty", 0.5), torch.tensor([5 / 3, 0.0]))
    # one model: every mode is that model
    single = scores[:1]
    for mode in ("mean", "min", "uncertainty"):
        assert aggregate_ensemble(single, mode).tolist() == [1.0, 0.0]


def test_model_reward_in_process_single_and_ensemble(tmp_path):
    from transformers import AutoTokenizer

    from rlx.config.paths import ASSETS_DIR
    from rlx.rewards.model import load_sequence_classifier, model_reward

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(ASSETS_DIR / "tiny")
    for name in ("a", "b"):  # two reward models with different random heads
        rm = load_sequence_classifier(str(ASSETS_DIR / "tiny"), pad_token_id=tok.pad_token_id)
        rm.save_pretrained(tmp_path / name)
        tok.save_pretrained(tmp_path / name)
    prompts, completions = ["1 + 2 ="] * 3, ["<answer>3</answer>", "<answer>4</answer>", "x"]
    a = torch.tensor(model_reward(prompts, completions, path=str(tmp_path / "a"), batch_size=2))
    b = torch.tensor(model_reward(prompts, completions, path=str(tmp_path / "b")))
    assert a.shape == (3,) and not torch.allclose(a, b)
    # batching does not change scores (padding is ignored)
    torch.testing.assert_close(a,
                               torch.tensor(model_reward(prompts, completions, path=str(tmp_path / "a"), batch_size=3)))
    both = [str(tmp_path / "a"), str(tmp_path / "b")]
    torch.testing.assert_close(torch.tensor(model_reward(prompts, completions, path=both, aggregate="min")),
                               torch.minimum(a, b))
    torch.testing.assert_close(torch.tensor(model_reward(prompts, completions, path=both)), (a + b) / 2)


@pytest.mark.long
def test_reference_in_memory_matches_precomputed(tmp_path, small_pairs):
    # both references are the starting policy, so the runs must agree (precompute only saves memory)
    evals = []
    for mode in ("precompute", "model"):
        out = tmp_path / mode
        out.mkdir()
        result = run_rlx(["train", "algorithm=dpo", *PREF_FAST, f"data.pairs.path={small_pairs}",
                          f"algorithm.reference={mode}", "save.final=false"], out)
        assert result.returncode == 0, result.stderr[-3000:]
        run = only_run_dir(out)
        assert (run / "reference_logps.pt").exists() == (mode == "precompute")
        evals.append(read_metrics(run / "metrics.jsonl")[-1])
    for key in ("eval/pref_loss", "eval/pref_accuracy", "pref/margin", "train/loss"):
        assert evals[0][key] == pytest.approx(evals[1][key], abs=1e-5), key
