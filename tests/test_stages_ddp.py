"""The producer's group stages, dynamic sampling and partial rollouts under a multi-process trainer (hardware=ddp,
2 gloo processes on the CPU): rank 0 samples the step's global batch through them (rlx/rollout/rank_zero.py),
broadcasts it, and every rank trains its shard. The 2-process run must sample, score and decide exactly what the
1-process run does (every reward, completion, stage and rollout figure equal), with the update's figures and final
weights equal up to the float32 order of the gradient's all-reduce.

The reward reads the sampled token ids (`token_reward`), so groups differ by construction and have a signal.
"""

import json

import pytest
from safetensors.torch import load_file

from rlx.config.paths import ASSETS_DIR
from tests.conftest import run_rlx
from tests.parallel_helpers import QUIET, SENSITIVE, final_weights

DDP = ["hardware=ddp", "hardware.cpu=true", "hardware.mixed_precision=no", "hardware.num_processes=2"]
# figures of the update and of the trainer's own forward over each rank's shard (the sampler-trainer log-prob gap,
# the correction's weights): another batch shape and float32 reduction order than one process's
UPDATE = ("train/", "optim/", "policy/", "perf/", "time", "mem/", "rollout/logprob_gap", "rollout/correction",
          "rollout/tis", "rollout/is_")
LOSS_TOL = 1e-5
WEIGHT_REL_TOL = 1e-3  # of how far the weights moved (tests/test_server_ddp.py says why)


def token_reward(prompts, completions, completion_ids=None, **row):
    """The first sampled token id mod 5, / 4: rows differ by their sampled tokens."""
    return [float(ids[0] % 5) / 4 if ids else 0.0 for ids in completion_ids]


def _run_dir(tmp_path, name):
    (run,) = (tmp_path / "outputs" / "train").glob(f"*_{name}")
    return run


SINGLE_TURN = ["rollout.max_new_tokens=8", "algorithm.scale=batch", "eval.size=4",
               "+reward.components.token._target_=tests.test_stages_ddp.token_reward",
               "+reward.components.token.weight=1.0"]


def compare(tmp_path, extra, base=SINGLE_TURN):
    """Train `extra` on one process and on 2 DDP processes; assert what was sampled and decided is equal, the loss
    and weights equal within float32 reduction order. Returns both runs' metrics rows."""
    args = ["steps=3", "prompts_per_step=4", "rollout.samples_per_prompt=4", "eval.every=3", *base, *extra]
    common = [*args, *SENSITIVE, *(q for q in QUIET if not q.startswith(("eval.every", "eval.size")))]
    for name, more in (("one", []), ("many", DDP)):
        result = run_rlx(["train", *common, f"name={name}", *more], tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
    assert "rank 0 samples the global batch and broadcasts it" in (_run_dir(tmp_path, "many") / "train.log").read_text()
    rows = {name: [json.loads(line) for line in (_run_dir(tmp_path, name) / "metrics.jsonl").read_text().splitlines()]
            for name in ("one", "many")}
    assert [r["step"] for r in rows["one"]] == [r["step"] for r in rows["many"]] == [1, 2, 3]
    for a, b in zip(rows["one"], rows["many"]):
        sampled = {k for k in a if not k.startswith(UPDATE)}
        assert sampled == {k for k in b if not k.startswith(UPDATE)}, (a["step"], sampled ^ set(b))
        for key in sorted(sampled):
            assert a[key] == b[key], (a["step"], key, a[key], b[key])
        assert abs(a["train/loss"] - b["train/loss"]) <= LOSS_TOL, (a["step"], a["train/loss"], b["train/loss"])
    one, many = final_weights(tmp_path, "one"), final_weights(tmp_path, "many")
    start = load_file(ASSETS_DIR / ("tiny_agent" if "model.path=builtin:tiny_agent" in args else "tiny")
                      / "model.safetensors")
    moved = max((one[k] - start[k]).abs().max().item() for k in one if k in start)
    gap = max((one[k] - many[k]).abs().max().item() for k in one)
    assert moved > 1e-5, f"training did not move the weights ({moved:.2e}); the comparison would prove nothing"
    assert gap < WEIGHT_REL_TOL * moved, f"the 2-process run's weights differ by {gap:.2e} (moved {moved:.2e})"
    return rows["one"], rows["many"]


@pytest.mark.slow  # ~90 s on 2 shared cores (a 1-process and a 2-process run)
def test_seed_stages_and_dynamic_sampling_on_two_processes_match_one(tmp_path):
    """Verifier noise, replay, difficulty-aware prompt sampling, a shaper and dynamic sampling: their decisions read
    the whole step (noise draws by row index, replay's buffer, pass rates per prompt, tied groups dropped)."""
    rows, _ = compare(tmp_path, ["algorithm.verifier_noise.fp_rate=0.3", "algorithm.replay.enabled=true",
                                 "algorithm.prompt_sampling.mode=hard", "algorithm.dynamic_sampling=true",
                                 "algorithm.max_sample_batches=2"])
    assert any(r["reward/total_std"] > 0 for r in rows)  # the groups had a signal
    assert any(key.startswith(("noise/", "verifier_noise/")) for key in rows[0]), sorted(rows[0])


@pytest.mark.slow  # ~90 s on 2 shared cores
def test_partial_rollouts_in_rounds_on_two_processes_match_one(tmp_path):
    """Partial rollouts in token-budget rounds: rank 0 holds the pool of carried groups; rounds.jsonl (written by
    rank 0) records the same rounds as one process's."""
    rows, _ = compare(tmp_path, ["rollout.partial=true", "rollout.correction=tis", "rollout.segment_tokens=4"])
    assert any(r["reward/total_std"] > 0 for r in rows)  # the groups had a signal
    assert any(r["rollout/partial_carried_frac"] > 0 for r in rows)  # groups were carried across steps

    def rounds(name):
        return [{k: v for k, v in json.loads(line).items() if k != "served"}
                for line in (_run_dir(tmp_path, name) / "rounds.jsonl").read_text().splitlines()]

    assert rounds("one") == rounds("many") and len(rounds("one")) > 3


@pytest.mark.slow  # ~90 s on 2 shared cores
def test_episodes_in_pipeline_mode_on_two_processes_match_one(tmp_path):
    """The agent family in pipeline mode: rank 0 plays the global batch of episodes (and the held-out ones) and
    broadcasts it; each rank trains whole tasks (rlx/rollout/rank_zero.py shard_episodes)."""
    rows, _ = compare(tmp_path, ["rollout.max_staleness=1", "rollout.correction=tis"],
                      base=["algorithm=agent_grpo", "env=grid", "model.path=builtin:tiny_agent", "data.source=none",
                            "env.eval_episodes=4"])
    assert all("env/return" in r for r in rows) and "eval/success" in rows[-1]
