"""The agent loop end to end (real `rlx train` subprocesses): metrics, custom environments, one-line
errors, and exact resume."""

import pytest
import torch

from rlx.engines.records import Episode
from rlx.loops.credit import step_tensors, token_advantages
from rlx.runtime.rundir import read_metrics
from tests.conftest import only_run_dir, run_rlx

BASE = ["data.source=none", "prompts_per_step=2", "rollout.samples_per_prompt=2", "env.eval_episodes=4",
        "env.max_turns=2", "env.max_new_tokens=3", "hardware.num_threads=1", "save.plot=false", "log.progress=false",
        "optimized_metric=eval/success"]


class ParityEnv:
    """Rewards differ within a group by construction (whatever the model samples): the reward is the
    parity of the action's character codes; anchor = the turn number."""

    def __init__(self, turns=2):
        self.turns = turns

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return f"task {seed % 7}", {"anchor": 0}

    def step(self, action):
        self.t += 1
        reward = float(sum(map(ord, action)) % 2)
        return f"turn {self.t}", reward, False, self.t >= self.turns, {"anchor": self.t, "metrics": {"success": reward}}


class SignalOnce:
    """Rewards differ within groups only in the first `varying` calls of `step` in this process: step 1's 4
    episodes end after one action each, stepped in row order, so groups of 2 score 1 and 0 whatever the model
    says. Every later step scores 0, so later steps carry no learning signal. (Counted on `step`, not on
    construction: start-up checks make and reset environments, and how many is theirs to change.)"""

    stepped = 0

    def __init__(self, varying=4):
        self.varying = varying

    def reset(self, *, seed=None, options=None):
        return "say anything", {}

    def step(self, action):
        SignalOnce.stepped += 1
        reward = float(SignalOnce.stepped % 2) if SignalOnce.stepped <= self.varying else 0.0
        return "done", reward, True, False, {"metrics": {"success": reward}}


def test_step_tensors_and_token_advantages():
    e0 = Episode(prompt_ids=[1], step_rewards=[0.0, 1.0], anchors=[(0, 0), (0, 1)], valid=[True, False])
    e1 = Episode(prompt_ids=[1], step_rewards=[0.5], anchors=[(0, 0)], valid=[True])
    group, step_episode, rewards, anchors = step_tensors([e0, e1], group_size=2, invalid_penalty=0.25)
    assert group.tolist() == [0, 0] and step_episode.tolist() == [0, 0, 1]
    assert rewards.tolist() == [0.0, 0.75, 0.5] and anchors.tolist() == [0, 1, 0]  # equal keys, equal ids
    step_index = torch.tensor([[0, 0, -1, 1], [0, -1, -1, -1]])
    adv = token_advantages(torch.tensor([1.0, 2.0, 3.0]), step_episode, step_index)
    assert adv.tolist() == [[1.0, 1.0, 0.0, 2.0], [3.0, 0.0, 0.0, 0.0]]


@pytest.mark.long
@pytest.mark.parametrize("algorithm", ["gigpo", "agent_grpo"])
def test_agent_training_runs_and_reports_env_metrics(tmp_path, algorithm):
    """~30 s each on an idle core (60-90 s on the shared 2-core machine)."""
    result = run_rlx(["train", f"algorithm={algorithm}", "env=grid", "steps=2", "eval.every=2", *BASE], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_metrics(only_run_dir(tmp_path) / "metrics.jsonl")
    last = rows[-1]
    for key in ("env/success", "env/return", "env/turns", "env/invalid_actions", "env/anchor_group_size",
                "eval/success", "eval/return", "eval/turns"):
        assert key in last, key
    assert 1 <= last["env/turns"] <= 2 and last["eval/turns"] <= 2


@pytest.mark.parametrize("args,needle", [
    (["algorithm=gigpo"], "add env=grid"),
    (["algorithm=gigpo", "env=custom", "env.target=nowhere_xyz.Env"], "No module named 'nowhere_xyz'"),
    (["algorithm=gigpo", "env=grid", "hardware=fsdp", "hardware.cpu=true"], "use hardware=ddp"),
    (["algorithm=gigpo", "env=grid", "algorithm.kl_in=reward"], "set algorithm.kl_in=loss"),
])
def test_agent_config_mistakes_are_one_line(tmp_path, args, needle):
    result = run_rlx(["train", *args, "data.source=none", "steps=1"], tmp_path, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], result.stderr[-2000:]


def train_then_resume(tmp_path, args):
    """`args` for 4 steps straight (run "full" under tmp_path/a), and for 2 steps then resumed to 4 (run
    "half" under tmp_path/b); returns the resumed run's directory."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    full = run_rlx(["train", *args, "steps=4", "name=full"], tmp_path / "a")
    assert full.returncode == 0, full.stderr[-3000:]
    half = run_rlx(["train", *args, "steps=2", "name=half"], tmp_path / "b")
    assert half.returncode == 0, half.stderr[-3000:]
    run = only_run_dir(tmp_path / "b")
    resumed = run_rlx(["train", f"resume={run}", "steps=4"], tmp_path / "b")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return run


@pytest.mark.long
def test_agent_resume_matches_an_uninterrupted_run(tmp_path):
    """3.5 min on the shared 2-core machine (three runs). A custom environment with group-varying rewards, so the
    updates are real."""
    args = ["algorithm=gigpo", "env=custom", "env.target=tests.test_agent_train.ParityEnv", "eval.every=4",
            "checkpoint.every=2", "optim.lr=1e-2", "optim.schedule=constant", *BASE]  # lr independent of steps
    run = train_then_resume(tmp_path, args)

    def comparable(path):  # the half run also evaluated at its last step (2): compare eval/* at the end only
        rows = read_metrics(path)
        return [{k: v for k, v in r.items() if not k.startswith("perf/") and k != "time"
                 and (not k.startswith("eval/") or r is rows[-1] or r["step"] == 0)} for r in rows]

    a, b = comparable(only_run_dir(tmp_path / "a") / "metrics.jsonl"), comparable(run / "metrics.jsonl")
    assert any(r.get("train/advantage_std", 0) > 0 for r in a)  # the runs did learn something
    assert a == b


@pytest.mark.long
def test_agent_micro_batching_does_not_change_the_step(tmp_path):
    """~40 s. One optimizer step over 8 episodes as 1 micro-batch of 8 or 4 of 2 (gradient accumulation):
    the same loss, so the same weights (Adam eps=1 makes the update proportional to the gradient, so a
    loss divided by the number of micro-batches would show)."""
    from safetensors.torch import load_file

    from rlx.config.paths import ASSETS_DIR
    from tests.parallel_helpers import QUIET, SENSITIVE, final_weights

    args = ["algorithm=gigpo", "env=custom", "env.target=tests.test_agent_train.ParityEnv", "steps=2",
            "prompts_per_step=4", "algorithm.loss_agg=token-mean", *BASE[2:-1], *SENSITIVE, *QUIET]
    for name, micro in (("whole", 8), ("micro", 2)):
        result = run_rlx(["train", *args, "data.source=none", f"micro_batch_size={micro}", f"name={name}"], tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
    whole, micro = final_weights(tmp_path, "whole"), final_weights(tmp_path, "micro")
    start = load_file(ASSETS_DIR / "tiny" / "model.safetensors")
    assert max((whole[k] - start[k]).abs().max().item() for k in whole) > 1e-3  # the steps moved the weights
    assert max((whole[k] - micro[k]).abs().max().item() for k in whole) < 1e-5


@pytest.mark.long
def test_steps_without_learning_signal_leave_the_weights_alone(tmp_path):
    """~30 s. Step 1 has group-varying rewards, steps 2-3 only zeros (and no KL/entropy term): their loss has
    zero gradient, and the loop takes no optimizer step, so the weights stay those of step 1. (AdamW stepped
    on a zero gradient would keep moving them along its momentum: that drift broke the grid runs.)"""
    from tests.parallel_helpers import checkpoint_weights

    args = ["algorithm=agent_grpo", "env=custom", "env.target=tests.test_agent_train.SignalOnce", "steps=3",
            "checkpoint.every=1", "checkpoint.keep=3", "eval.every=0", "eval.at_start=false", "optim.lr=1e-2",
            "name=once", *BASE]
    result = run_rlx(["train", *args], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_metrics(only_run_dir(tmp_path) / "metrics.jsonl")
    assert [r["train/update_skipped"] for r in rows if "train/update_skipped" in r] == [0.0, 1.0, 1.0]
    first, last = checkpoint_weights(tmp_path, "once", 1), checkpoint_weights(tmp_path, "once", 3)
    assert all(torch.equal(first[k], last[k]) for k in first)


@pytest.mark.long
def test_agent_sft_resume_matches_an_uninterrupted_run(tmp_path):
    """~30 s. The warm start's loop (recipe tiny_agent_sft, shortened): 4 steps straight, or 2 steps then
    resumed to 4, end with the same weights bit for bit (demonstrations come from (seed, step, index))."""
    from safetensors.torch import load_file

    from rlx.config.paths import ASSETS_DIR
    from tests.parallel_helpers import final_weights

    args = ["tiny_agent_sft", "checkpoint.every=2", "eval.every=2", "env.eval_episodes=3", "hardware.num_threads=1",
            "save.plot=false", "log.progress=false", "prompts_per_step=2"]
    train_then_resume(tmp_path, args)
    a, b = final_weights(tmp_path / "a", "full"), final_weights(tmp_path / "b", "half")
    start = load_file(ASSETS_DIR / "tiny" / "model.safetensors")
    assert max((a[k] - start[k]).abs().max().item() for k in a) > 1e-3  # the steps moved the weights
    assert all(torch.equal(a[k], b[k]) for k in a)
