"""Partial rollouts (rollout.partial=true) with the seed stages: the stages that act on finished groups (verifier
noise, replay, hints, group reward shaping with LASER-D, the advantage transforms) run on the groups each step
finishes, through the single-turn producer's StagePipeline; the two that cannot (the difficulty-aware prompt sampler,
the per-position temperature schedule) are refused with their reason. Real in-process runs on the tiny model
(tests/test_seed_wiring.py's `train`), 1-3 s each."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rlx.config.async_rules import check_async_settings
from rlx.config.overrides import check_overrides
from rlx.config.rules import check_settings
from rlx.config.settings import checked_settings
from rlx.errors import UserError
from rlx.rollout.stages import Stage, StagePipeline
from tests.conftest import run_rlx
from tests.loop_fixtures import QUIET
from tests.test_seed_wiring import Stopped, stop_after, train

# partial rollouts with twice the groups in flight: from step 2 on, the trained groups were begun a step earlier
PARTIAL = ["rollout.partial=true", "rollout.correction=tis", "rollout.partial_oversample=2"]

# option -> (overrides, its mechanism metric), as tests/test_seed_wiring.py MECHANISMS
COMPOSING = {
    "verifier_noise": (["algorithm.verifier_noise.fn_rate=0.3", "algorithm.verifier_noise.fp_rate=0.2"],
                       "noise/flipped_frac"),
    "replay": (["algorithm.replay.enabled=true", "data.train_size=4", "algorithm.replay.trigger=tied"],
               "replay/groups_filled"),
    "laser_d": (["algorithm=laser_d", "algorithm.shaping.adapt_every=1"], "shaping/laser_d_delta_abs"),
    "hints_prefix": (["algorithm.hints.enabled=true", "algorithm.hints.placement=prefix"], "hints/hinted_groups"),
    "hints_guide": (["algorithm.hints.enabled=true"], "hints/hinted_groups"),
    "pass_at_k": (["algorithm.transforms=[pass_at_k]", "algorithm.shaping.pass_k=2"], "transform/pass_at_k_delta_abs"),
}


def refusal(*overrides: str) -> str | None:
    cfg = check_overrides([*QUIET, *overrides])
    check_settings(checked_settings(cfg))
    try:
        check_async_settings(checked_settings(cfg), 1)
    except UserError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("option", COMPOSING)
def test_the_composing_stages_are_accepted_with_partial_rollouts(option):
    assert refusal(*COMPOSING[option][0], *PARTIAL) is None


@pytest.mark.parametrize("overrides,reason", [
    (["algorithm.prompt_sampling.mode=learnability"], "pairs the prompts drawn at a step with that step's verdicts"),
    (["rollout.temperature_schedule.mode=ead"], "sets each position's temperature by the step"),
])
def test_the_stages_that_cannot_compose_are_refused_with_their_reason(overrides, reason):
    message = refusal(*overrides, *PARTIAL)
    assert message is not None and reason in message and "rollout.partial=false" in message and "\n" not in message
    assert refusal(*overrides) is None  # without partial rollouts they run


@pytest.mark.parametrize("option", COMPOSING)
def test_a_partial_run_uses_the_stage_on_carried_groups(tmp_path, option):
    """3 steps: the stage's metric is logged at every step and moves at one, and from step 2 on every trained group
    was begun a step earlier (carried), so the stage acted on carried groups."""
    overrides, metric = COMPOSING[option]
    rows = train(tmp_path, *overrides, *PARTIAL, steps=3)
    values = [row.get(metric) for row in rows]
    assert all(isinstance(v, (int, float)) for v in values), (metric, values)
    assert any(v != 0 for v in values), (metric, values)
    assert [row["rollout/partial_carried_frac"] for row in rows][1:] == [1.0, 1.0]


def test_partial_with_oversample_1_is_the_synchronous_step_stages_included(tmp_path):
    """oversample 1 carries nothing: the partial producer's step is the synchronous one, so verifier noise, replay
    and LASER-D (one pipeline, the same seeds) log the same values at every step, and so do the rewards."""
    stages = ["algorithm=laser_d", "algorithm.shaping.adapt_every=1", "algorithm.verifier_noise.fn_rate=0.3",
              "algorithm.replay.enabled=true", "data.train_size=4", "algorithm.replay.trigger=tied",
              "rollout.correction=tis"]
    sync = train(tmp_path, *stages, steps=3, run_dir=tmp_path / "sync")
    partial = train(tmp_path, *stages, "rollout.partial=true", "rollout.partial_oversample=1", steps=3,
                    run_dir=tmp_path / "partial")
    compared = [k for k in sync[0] if k.split("/")[0] in ("noise", "replay", "shaping", "reward")]
    assert {"noise/flipped_frac", "replay/groups_filled", "shaping/laser_d_delta_abs"} <= set(compared)
    assert any(row["noise/flipped_frac"] > 0 for row in sync) and any(row["replay/groups_filled"] > 0 for row in sync)
    for step, (a, b) in enumerate(zip(sync, partial), start=1):
        assert {k: b.get(k) for k in compared} == {k: a[k] for k in compared}, step


@pytest.mark.parametrize("option", ["replay", "laser_d", "hints_prefix"])
def test_resume_with_partial_rollouts_and_a_stage_is_exact(tmp_path, option, monkeypatch):
    """4 steps straight against the same run stopped after its step-2 checkpoint and resumed: every logged value
    equal (the pool, and the replay buffer / LASER-D's targets, come back from the checkpoint)."""
    overrides = [*COMPOSING[option][0], *PARTIAL, "checkpoint.every=2"]
    full = train(tmp_path, *overrides, steps=4, run_dir=tmp_path / "full")
    with monkeypatch.context() as patch:
        stop_after(patch, 2)
        with pytest.raises(Stopped):
            train(tmp_path, *overrides, steps=4, run_dir=tmp_path / "cut")
    resumed = train(tmp_path, *overrides, f"resume={tmp_path / 'cut'}", steps=4, run_dir=tmp_path / "cut")
    strip = lambda row: {k: v for k, v in row.items() if k != "time" and not k.startswith("perf/")}  # noqa: E731
    assert len(resumed) == len(full) == 4
    assert any(full[i][COMPOSING[option][1]] for i in (2, 3))  # the stage acted after the resume point
    for step, (got, want) in enumerate(zip(resumed, full), start=1):
        assert strip(got) == strip(want), (step, {k: (got.get(k), want.get(k)) for k in strip(want)
                                                  if got.get(k) != want.get(k)})


class Seen(Stage):
    """Records the groups' prompts of each round it is given, and adds 1 to every reward."""

    name = "seen"

    def __init__(self):
        self.rounds = []

    def after_scoring(self, part, ctx, first_index):
        self.rounds.append(([row["prompt"] for row in part.rows[::ctx.group_size]], ctx.step, first_index))
        return replace(part, rewards=part.rewards + 1)

    def after_step(self, parts, step):
        return {"seen/rounds": float(len(parts))}


def test_the_stages_get_the_finished_groups_carried_ones_included_as_one_round():
    """tests/test_partial.py's scripted case: step 3 trains p0 and p2, begun at step 1; the stage sees exactly the
    trained groups, one round per step, and what it returns is what trains."""
    from tests.test_partial import producer

    made, _ = producer([9, 2, 7, 3, 1, 1, 5, 5])
    seen = Seen()
    made.stages = StagePipeline([seen])
    batches = [made.produce(step) for step in (1, 2, 3)]
    assert seen.rounds == [(["p1", "p3"], 1, 0), (["p4", "p5"], 2, 0), (["p0", "p2"], 3, 0)]
    plain, _ = producer([9, 2, 7, 3, 1, 1, 5, 5])
    for step, batch in enumerate(batches, start=1):
        assert batch.metrics["seen/rounds"] == 1.0
        assert batch.rewards.tolist() == [r + 1 for r in plain.produce(step).rewards.tolist()]


class Scheduled(Stage):
    name = "scheduled"

    def schedule(self, step, max_new_tokens):
        return [1.0] * max_new_tokens


def test_a_users_stage_with_a_temperature_schedule_is_refused_by_the_partial_producer():
    from rlx.rollout.partial import PartialProducer
    from tests.test_partial import producer

    made, generator = producer([2, 2])
    with pytest.raises(UserError, match="a stage of algorithm.stages sets each position's temperature") as refused:
        PartialProducer(generator, made.tokenizer, made.stream, made.rewards, made.settings, oversample=1.0,
                        stages=StagePipeline([Scheduled()]))
    assert "\n" not in str(refused.value) and "rollout.partial=false" in str(refused.value)


def test_partial_rollouts_with_a_temperature_schedule_stop_with_one_line_exit_2(tmp_path):
    """The config rule (rlx/config/async_rules.py partial_schedule_refusal) stops `rlx train` before any model."""
    result = run_rlx(["train", *PARTIAL, "rollout.temperature_schedule.mode=ead", "steps=1"], tmp_path, timeout=300)
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
    assert "rollout.temperature_schedule.mode=ead sets each position's temperature by the step" in lines[0]
