"""rollout=server and pipeline mode (rollout=server or hf) under a multi-process trainer (hardware=ddp, 2 gloo processes
on the CPU): rank 0 alone samples the global batch (HTTP to the server, rewards on rank 0), broadcasts it, and every
rank trains its shard (rlx/rollout/rank_zero.py). The 2-process run must take the steps the 1-process run takes on the
same config.

The server is tests/fake_vllm.py's FakeVLLM in this test process: a completion is a function of the request's seed,
so both runs see the same rows exactly when they ask for the same rows with the same seeds. The reward reads the
sampled token ids (`token_reward`), so groups have a signal and the update moves the weights.
"""

import json

import pytest
import torch
from safetensors.torch import load_file

from rlx.config.overrides import check_overrides
from rlx.config.paths import ASSETS_DIR
from rlx.errors import UserError
from tests.conftest import run_rlx
from tests.fake_vllm import FakeVLLM
from tests.parallel_helpers import QUIET, SENSITIVE, final_weights

# exact equality of the reward and completion figures: rank 0 computes them over the whole batch, as one process does
EXACT = ("reward/total", "reward/total_std", "reward/token", "completions/mean_length", "completions/max_length",
         "train/frac_zero_std_groups", "rollout/policy_version", "rollout/staleness_mean")
# the loss is a sum of per-process shares reduced over gloo, in another order than one process sums its rows: float32
# rounding of a handful of terms of size ~1 (relative error ~1e-7 each); 1e-5 is far below a wrong shard's change
LOSS_TOL = 1e-5
# the weights after 2 steps through Adam with eps=1 (parallel_helpers.SENSITIVE): the update is ~ lr x gradient, so
# the 2-process run's gradient reduction (float32, another summation order) differs by ~1e-7 of the update; a wrong
# shard or a doubled row changes the update itself. Relative to how far the weights moved, as pipeline mode's TIS
# weights (the fake server's log-probs are far above the tiny policy's) make the update small.
WEIGHT_REL_TOL = 1e-3


DDP = ["hardware=ddp", "hardware.cpu=true", "hardware.mixed_precision=no", "hardware.num_processes=2"]
FSDP = ["hardware=fsdp", "hardware.cpu=true", "hardware.mixed_precision=no", "hardware.num_processes=2"]


def token_reward(prompts, completions, completion_ids=None, **row):
    """The first sampled token id mod 5, / 4: the fake server's tokens follow each row's seed, so rows differ."""
    return [float(ids[0] % 5) / 4 if ids else 0.0 for ids in completion_ids]


def run_metrics(tmp_path, name):
    (run,) = (tmp_path / "outputs" / "train").glob(f"*_{name}")
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def compare(tmp_path, extra, many=DDP):
    fake = FakeVLLM()
    try:
        args = ["steps=2", "prompts_per_step=4", "rollout.samples_per_prompt=2", "rollout.max_new_tokens=8",
                "algorithm.scale=batch", "eval.every=2", "eval.size=4",
                "+reward.components.token._target_=tests.test_server_ddp.token_reward",
                "+reward.components.token.weight=1.0", *extra]
        if "rollout=server" in extra:
            args = [*args, f"rollout.server.urls=[{fake.url}]", f"rollout.server.work_dir={tmp_path / 'server'}"]
        common = [*args, *SENSITIVE, *(q for q in QUIET if not q.startswith(("eval.every", "eval.size")))]
        for name, more in (("one", []), ("many", many)):
            result = run_rlx(["train", *common, f"name={name}", *more], tmp_path)
            assert result.returncode == 0, result.stderr[-3000:]
    finally:
        fake.close()
    one, many = final_weights(tmp_path, "one"), final_weights(tmp_path, "many")
    start = load_file(ASSETS_DIR / "tiny" / "model.safetensors")
    rows_one, rows_many = run_metrics(tmp_path, "one"), run_metrics(tmp_path, "many")
    assert [r["step"] for r in rows_one] == [r["step"] for r in rows_many] == [1, 2]
    for a, b in zip(rows_one, rows_many):
        for key in EXACT:
            assert a.get(key) == b.get(key), (a["step"], key, a.get(key), b.get(key))
        assert abs(a["train/loss"] - b["train/loss"]) <= LOSS_TOL, (a["step"], a["train/loss"], b["train/loss"])
        assert a["reward/total_std"] > 0  # the groups had a signal
    assert rows_one[-1]["eval/reward"] == rows_many[-1]["eval/reward"]  # rank 0 evaluated every held-out row
    moved = max((one[k] - start[k]).abs().max().item() for k in one if k in start)
    gap = max((one[k] - many[k]).abs().max().item() for k in one)
    assert moved > 1e-5, f"training did not move the weights ({moved:.2e}); the comparison would prove nothing"
    assert gap < WEIGHT_REL_TOL * moved, f"the 2-process run's weights differ by {gap:.2e} (moved {moved:.2e})"
    return rows_one, rows_many


@pytest.mark.slow  # ~75 s on 2 shared cores (a 1-process and a 2-process run)
def test_server_rollouts_on_two_processes_match_one(tmp_path):
    compare(tmp_path, ["rollout=server"])


@pytest.mark.slow  # ~75 s on 2 shared cores
def test_server_pipeline_on_two_processes_matches_one(tmp_path):
    rows, _ = compare(tmp_path, ["rollout=server", "rollout.max_staleness=1", "rollout.correction=tis"])
    assert rows[1]["rollout/staleness_max"] == 1.0  # batch 2 came from the starting weights: the pipeline ran ahead


@pytest.mark.slow  # ~80 s on 2 shared cores
def test_hf_pipeline_on_two_processes_matches_one(tmp_path):
    """rollout=hf in pipeline mode: rank 0's copy of the policy samples the whole batch in the producer thread (a
    module's own forward, no collective) with the seeds one process uses, so the rows are the same."""
    rows, _ = compare(tmp_path, ["rollout.max_staleness=1", "rollout.correction=tis"])
    assert rows[1]["rollout/staleness_max"] == 1.0


def test_what_still_runs_on_one_process_is_one_line():
    from rlx.cli.training import check_run

    ddp = ["hardware=ddp", "hardware.cpu=true", "hardware.num_processes=2", "rollout=server",
           "rollout.server.urls=[http://127.0.0.1:9]"]
    check_run(check_overrides(ddp))  # allowed: rank 0 drives the server
    check_run(check_overrides([*ddp[:3], "rollout.max_staleness=1", "rollout.correction=tis"]))  # the hf pipeline too
    # under FSDP: pipeline mode samples with its own copy (gathered weights); rank 0's own shards cannot sample
    check_run(check_overrides(["hardware=fsdp", *ddp[1:3], "rollout.max_staleness=1", "rollout.correction=tis"]))
    with pytest.raises(UserError, match=r"^algorithm.replay.enabled=true with 2 processes samples with rank 0's "
                                        r"parameters, and under hardware.distributed=fsdp they are shards"):
        check_run(check_overrides(["hardware=fsdp", *ddp[1:3], "algorithm.replay.enabled=true"]))
    # episodes too: rank 0 plays the global batch, each rank trains whole tasks (tests/test_stages_ddp.py)
    check_run(check_overrides(["algorithm=gigpo", "env=grid", *ddp[:3], "rollout.max_staleness=1",
                               "rollout.correction=tis"]))
    with pytest.raises(UserError,
                       match=r"^rollout=server with 2 processes samples on rank 0 .* trains from no producer"):
        check_run(check_overrides(["algorithm=agent_sft", "env=grid", *ddp]))
    check_run(check_overrides([*ddp[:3], "rollout.partial=true", "rollout.correction=tis"]))  # rank 0 holds the pool
    with pytest.raises(UserError, match=r"^rollout.partial=true with 2 processes samples with rank 0's parameters"):
        check_run(check_overrides(["hardware=fsdp", *ddp[1:3], "rollout.partial=true", "rollout.correction=tis"]))


@pytest.mark.slow  # ~90 s on 2 shared cores
def test_server_rollouts_under_fsdp_on_two_processes_match_one(tmp_path):
    """hardware=fsdp: each publish gathers the full weights from the two ranks' shards into rank 0's CPU copy of the
    policy (rlx/rollout/rank_zero.py GatheredPublish), which rank 0 publishes. The rows follow the request seeds
    (the fake server), so the served file is compared too: after the last step it holds the final weights."""
    compare(tmp_path, ["rollout=server"], many=FSDP)
    (run,) = (tmp_path / "outputs" / "train").glob("*_many")
    assert "gathers the full weights from the shards" in (run / "train.log").read_text()
    served = load_file(tmp_path / "server" / "model" / "model.safetensors")
    final = final_weights(tmp_path, "many")
    common = [k for k in final if k in served]
    assert len(common) >= len(final) - 1, (sorted(final)[:3], sorted(served)[:3])  # a tied head may be apart
    assert all(torch.equal(final[k], served[k]) for k in common)


def test_which_strategies_publish_gathered_weights():
    """rollout=server and pipeline mode publish a full copy gathered from FSDP2 or ZeRO-3 shards (on one process
    too: FSDP always shards); ZeRO-1/2 hold full parameters, so rank 0 publishes its own."""
    from rlx.cli.training import check_run
    from rlx.config.async_rules import gathers_to_publish, holds_full_parameters

    server = ["rollout=server", "rollout.server.urls=[http://127.0.0.1:9]"]
    fsdp = ["hardware=fsdp", "hardware.cpu=true", "hardware.mixed_precision=no"]
    for hardware, gathered in ((["hardware=ddp", "hardware.cpu=true", "hardware.num_processes=2"], False),
                               ([*fsdp, "hardware.num_processes=2"], True), (fsdp, True),
                               (["hardware=deepspeed_zero2", "hardware.num_processes=2"], False),
                               (["hardware=deepspeed_zero3", "hardware.num_processes=2"], True)):
        s = check_run(check_overrides([*server, *hardware])) if "deepspeed" not in hardware[0] else None
        if s is None:  # DeepSpeed may be missing here: the settings alone (check_strategy asks for the package)
            from rlx.config.settings import checked_settings

            s = checked_settings(check_overrides([*server, *hardware]))
        assert gathers_to_publish(s) is gathered and holds_full_parameters(s.hardware) is not gathered, hardware
    s = check_run(check_overrides([*server, *fsdp, "rollout.max_staleness=1", "rollout.correction=tis"]))
    assert gathers_to_publish(s)  # the pipeline's copy is given the gathered weights too


@pytest.mark.slow  # ~2.5 min on 2 shared cores (DeepSpeed's start-up)
def test_server_rollouts_under_zero3_on_two_processes_match_one(tmp_path):
    """hardware=deepspeed_zero3 with every parameter partitioned: the publish gathers them through DeepSpeed's
    engine (the prepared model) into rank 0's copy; the served file after the last step holds the final weights."""
    pytest.importorskip("deepspeed")
    zero3 = ["hardware=deepspeed_zero3", "hardware.mixed_precision=no", "hardware.num_processes=2",
             "hardware.deepspeed.param_persistence_threshold=0"]
    compare(tmp_path, ["rollout=server"], many=zero3)
    served = load_file(tmp_path / "server" / "model" / "model.safetensors")
    final = final_weights(tmp_path, "many")
    common = [k for k in final if k in served]
    assert len(common) >= len(final) - 1 and all(torch.equal(final[k], served[k]) for k in common)


@pytest.mark.slow  # ~60 s on 2 shared cores
def test_hf_pipeline_under_fsdp_on_two_processes_matches_one(tmp_path):
    """Pipeline mode under FSDP2: each publish gathers the full weights into rank 0's copy, which the producer
    thread's own copy of the policy loads between batches; the evaluation samples rank 0's gathered copy."""
    rows, _ = compare(tmp_path, ["rollout.max_staleness=1", "rollout.correction=tis"], many=FSDP)
    assert rows[1]["rollout/staleness_max"] == 1.0
