"""Data parallelism: N gloo processes on the CPU take the same optimizer steps as one process.

The settings make every shortcut visible: two prompts per process with batch-std advantage scaling
(per-process advantages would differ), token-mean loss (a per-process token count would differ), and
an Adam eps that makes the update proportional to the gradient (a missing x N loss scale would halve it).
"""

import pytest

from tests.parallel_helpers import assert_same_parameters, checkpoint_weights

pytestmark = pytest.mark.long  # ~40 s per loop family on 2 idle cores (two runs, one with 2 processes)


@pytest.mark.slow  # in CI (make test-slow); the other families are make test-long
def test_grpo_two_processes_match_one(tmp_path):
    assert_same_parameters(tmp_path, ["steps=2", "prompts_per_step=4", "rollout.samples_per_prompt=4",
                                      "algorithm.scale=batch", "algorithm.kl_coef=0.1"])


def test_sft_two_processes_match_one(tmp_path):
    assert_same_parameters(tmp_path, ["algorithm=sft", "steps=2", "algorithm.batch_size=8", "micro_batch_size=2"])


def test_dpo_two_processes_match_one(tmp_path):
    # reference log-probs precomputed on every process; the pair loss is a mean over the global batch
    assert_same_parameters(tmp_path, ["algorithm=dpo", "data=prefs", "steps=2", "algorithm.batch_size=8",
                                      "micro_batch_size=2"])


def test_ppo_two_processes_match_one(tmp_path):
    # one optimizer step per rollout batch (epochs=1, mini_batches=1) so the 1-process mini-batch is the
    # global one; whitening (default on) needs the global token statistics, KL in the loss the global count
    assert_same_parameters(tmp_path, ["algorithm=ppo", "steps=2", "prompts_per_step=4", "rollout.samples_per_prompt=4",
                                      "algorithm.epochs=1", "algorithm.mini_batches=1", "algorithm.kl_coef=0.1",
                                      "algorithm.value_lr=0.05"])
    # the value model (second prepared model) is in the final checkpoint
    one, many = (checkpoint_weights(tmp_path, "one", 2, "model_1.safetensors"),
                 checkpoint_weights(tmp_path, "many", 2, "model_1.safetensors"))
    assert one["head.weight"].abs().max() > 1e-3  # trained away from its zero initialisation
    gap = max((one[k] - many[k]).abs().max().item() for k in one)
    assert gap < 1e-5, f"value models differ by {gap:.2e}"


def test_reward_model_two_processes_match_one(tmp_path):
    # the backbone moves little in a few steps while the new score head learns: a tighter tolerance keeps
    # the comparison meaningful (moved > 100 x atol)
    assert_same_parameters(tmp_path, ["algorithm=reward_model", "data=prefs", "steps=4", "algorithm.batch_size=8",
                                      "micro_batch_size=2"], atol=2e-6)


def run_metrics(tmp_path, name):
    """The metrics.jsonl rows of run `name` under tmp_path."""
    import json

    (run,) = (tmp_path / "outputs" / "train").glob(f"*_{name}")
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_agent_sft_two_processes_match_one(tmp_path):
    """The agent warm start's loop: each process imitates its shard of the demonstrations (mixture: grid,
    corridor and tool use, episodes of different lengths, so a per-process token count would differ),
    two micro-batches per process (gradient accumulation). Same weights and metrics as one process."""
    args = ["algorithm=agent_sft", "env=mixture", "data.source=none", "steps=2", "prompts_per_step=4",
            "rollout.samples_per_prompt=2", "micro_batch_size=2", "env.eval_episodes=4", "log.progress=false"]
    assert_same_parameters(tmp_path, args)
    rows = {name: run_metrics(tmp_path, name) for name in ("one", "many")}
    for a, b in zip(rows["one"], rows["many"], strict=True):
        for key in ("demo/success", "demo/turns", "train/loss"):
            if key in a:
                assert a[key] == pytest.approx(b[key], abs=1e-5), (key, a[key], b[key])
    assert "demo/turns" in rows["one"][-1]


def test_agent_two_processes_match_one(tmp_path):
    """GiGPO on a custom environment whose rewards differ within every group: each process plays its two
    tasks (episode and anchor groups lie within a task), token-mean loss over the global token count
    (a per-process count would differ: episodes have different lengths), two micro-batches per step
    (gradient accumulation), KL to the reference. Same weights and the same global env/train metrics
    (gathered from both processes) as one process."""
    args = ["algorithm=gigpo", "env=custom", "env.target=tests.test_agent_train.ParityEnv", "data.source=none",
            "steps=2", "prompts_per_step=4", "rollout.samples_per_prompt=2", "micro_batch_size=2",
            "algorithm.loss_agg=token-mean", "algorithm.kl_coef=0.1", "env.max_turns=2", "env.max_new_tokens=3",
            "env.eval_episodes=4", "log.progress=false"]
    assert_same_parameters(tmp_path, args)
    rows = {name: run_metrics(tmp_path, name) for name in ("one", "many")}
    for a, b in zip(rows["one"], rows["many"], strict=True):
        for key in ("env/success", "env/return", "env/turns", "env/anchor_group_size", "train/advantage_std",
                    "completions/tokens_per_episode"):
            assert a[key] == pytest.approx(b[key], abs=1e-6), (key, a[key], b[key])
        assert a["train/loss"] == pytest.approx(b["train/loss"], abs=1e-5)
    assert any(r["train/advantage_std"] > 0 for r in rows["one"])  # a learning signal, by construction
