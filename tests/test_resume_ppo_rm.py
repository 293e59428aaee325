"""Exact resume of the PPO and reward-model loops, and the reference reset as checkpointed state.

A resumed run is made from a finished one: its run directory is copied and the checkpoints after
step k (and final/) removed, which is what a run killed after writing the checkpoint of step k
leaves behind. The resumed copy must end with the uninterrupted run's weights (every prepared model:
policy AND value model) and metrics rows.
"""

import shutil

import pytest
import torch
from safetensors.torch import load_file

from rlx.config.rules import check_batch, check_settings
from rlx.config.settings import checked_settings
from rlx.errors import UserError
from rlx.loops.common import ReferenceReset
from rlx.runtime.checkpoint import Checkpointer, list_checkpoints
from rlx.runtime.rundir import read_metrics
from tests.conftest import only_run_dir, run_rlx
from tests.test_checkpoint_resume import _cfg, _comparable

QUIET = ["hardware.num_threads=1", "save.plot=false", "log.samples_every=0", "log.progress=false"]


def _killed_copy(run, step, dest):
    """A copy of `run` as a run killed right after writing the checkpoint of `step` would leave it."""
    copy = dest / "outputs" / "train" / run.name
    shutil.copytree(run, copy)
    for saved, path in list_checkpoints(copy):
        if saved > step:
            shutil.rmtree(path)
    shutil.rmtree(copy / "final", ignore_errors=True)
    assert list_checkpoints(copy)[-1][0] == step
    return copy


def _assert_same_checkpoint(want, got, files):
    for name in files:
        a, b = load_file(want / name), load_file(got / name)
        assert a.keys() == b.keys(), name
        for key in a:
            assert torch.equal(a[key], b[key]), f"{name}: {key}"


def _resume_and_compare(tmp_path, run, step, total, files):
    copy = _killed_copy(run, step, tmp_path / "cut")
    resumed = run_rlx(["train", f"resume={copy}"], tmp_path / "cut")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {copy / 'checkpoints' / f'step_{step:06d}'}" in resumed.stdout + resumed.stderr
    want_rows, got_rows = read_metrics(run / "metrics.jsonl"), read_metrics(copy / "metrics.jsonl")
    assert [r["step"] for r in got_rows] == [r["step"] for r in want_rows]
    assert _comparable(got_rows) == _comparable(want_rows)
    final = f"step_{total:06d}"
    _assert_same_checkpoint(run / "checkpoints" / final, copy / "checkpoints" / final, files)
    return want_rows


def test_ppo_resume_matches_an_uninterrupted_run(tmp_path):
    # the reference is reset at the start of step 3 (every 2 steps) and checkpointed after it: the
    # resumed step 4 needs that reset reference (not the starting policy) for the same train/kl_ref;
    # kl_target makes the KL coefficient state, mini_batches=2 uses the shuffle generator
    args = ["algorithm=ppo", "steps=4", "prompts_per_step=2", "rollout.samples_per_prompt=4", "eval.size=4",
            "eval.every=2", "checkpoint.every=3", "algorithm.kl_coef=0.05", "algorithm.ref_reset_every=2",
            "algorithm.kl_target=0.01", "optim.lr=1e-2", "algorithm.value_lr=1e-2", *QUIET]
    (tmp_path / "full").mkdir()
    full = run_rlx(["train", *args], tmp_path / "full")
    assert full.returncode == 0, full.stderr[-3000:]
    run = only_run_dir(tmp_path / "full")
    # both models and both optimizers are in the checkpoint (Accelerate numbers the second one _1)
    files = ["model.safetensors", "model_1.safetensors"]
    rows = _resume_and_compare(tmp_path, run, 3, 4, files)
    assert rows[4]["train/kl_coef"] != rows[1]["train/kl_coef"]  # the adaptive coefficient moved
    assert rows[4]["train/kl_ref"] > 0
    ckpt = run / "checkpoints"
    value_3, value_4 = (load_file(ckpt / "step_000003" / "model_1.safetensors"),
                        load_file(ckpt / "step_000004" / "model_1.safetensors"))
    assert any(not torch.equal(value_3[k], value_4[k]) for k in value_3)  # the value model trains in step 4


def test_reward_model_resume_matches_an_uninterrupted_run(tmp_path):
    args = ["algorithm=reward_model", "data=prefs", "steps=4", "algorithm.batch_size=4", "micro_batch_size=2",
            "data.pairs.eval_size=8", "eval.size=4", "eval.every=2", "checkpoint.every=2", "data.train_size=300",
            "optim.lr=1e-2", *QUIET]
    (tmp_path / "full").mkdir()
    full = run_rlx(["train", *args], tmp_path / "full")
    assert full.returncode == 0, full.stderr[-3000:]
    run = only_run_dir(tmp_path / "full")
    rows = _resume_and_compare(tmp_path, run, 2, 4, ["model.safetensors"])
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4] and "eval/pref_accuracy" in rows[4]


def test_reference_reset_is_checkpointed_and_restored(tmp_path):
    from accelerate import Accelerator

    def setup(seed):
        torch.manual_seed(seed)
        policy, reference = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
        optimizer = torch.optim.SGD(policy.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
        acc = Accelerator(cpu=True)
        policy, optimizer = acc.prepare(policy, optimizer)
        return acc, policy, reference, scheduler

    acc, policy, reference, scheduler = setup(0)
    reset = ReferenceReset(reference, every=2)
    assert ReferenceReset(reference, every=0).checkpointed() == {} and ReferenceReset(None, 2).checkpointed() == {}
    ckpt = Checkpointer(acc, tmp_path, every=1, keep=1, total_steps=10, resume=False)
    ckpt.restore(scheduler=scheduler, **reset.checkpointed())
    for step in (1, 2, 3):  # resets at the start of step 3 only: (3 - 1) % 2 == 0
        reset.maybe_reset(step, policy)
        with torch.no_grad():
            policy.weight.add_(1.0)  # a "training step"
    ckpt.save(3)
    ckpt.close()
    assert torch.equal(reference.weight, policy.weight - 1.0)  # the policy as it was after step 2

    acc2, _, reference2, scheduler2 = setup(5)
    reset2 = ReferenceReset(reference2, every=2)
    resumed = Checkpointer(acc2, tmp_path, every=1, keep=1, total_steps=10, resume=True)
    assert resumed.restore(scheduler=scheduler2, **reset2.checkpointed()) == 3
    resumed.close()
    assert torch.equal(reference2.weight, reference.weight) and torch.equal(reference2.bias, reference.bias)


def test_ppo_and_reward_model_pass_the_multi_process_batch_check():
    check_batch(checked_settings(_cfg("algorithm=ppo", "prompts_per_step=4", "algorithm.mini_batches=2")), 2)
    check_batch(checked_settings(_cfg("algorithm=reward_model", "algorithm.batch_size=8")), 4)
    # ppo splits prompts x samples over processes and mini-batches like the policy-gradient family
    with pytest.raises(UserError, match="make prompts_per_step a multiple of 2"):
        check_batch(checked_settings(_cfg("algorithm=ppo", "prompts_per_step=3")), 2)
    with pytest.raises(UserError, match="algorithm.mini_batches=4 does not divide"):
        check_batch(checked_settings(_cfg("algorithm=ppo", "prompts_per_step=4", "rollout.samples_per_prompt=3",
                         "algorithm.mini_batches=4")), 2)
    # dynamic sampling on several processes: rank 0 draws the step's groups (rlx/rollout/rank_zero.py)
    check_batch(checked_settings(_cfg("algorithm=ppo", "prompts_per_step=4", "algorithm.dynamic_sampling=true")), 2)


def test_reference_reset_under_lora_is_a_user_error():
    # the policy-gradient reference under LoRA is the adapter-disabled policy: there is no copy to reset
    with pytest.raises(UserError, match="ref_reset_every=0 or model.lora.enabled=false"):
        check_settings(checked_settings(_cfg("model.lora.enabled=true", "algorithm.kl_coef=0.05",
                                             "algorithm.ref_reset_every=2")))
    # a full copy resets
    check_settings(checked_settings(_cfg("algorithm.kl_coef=0.05", "algorithm.ref_reset_every=2")))
