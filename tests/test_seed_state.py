"""Per-prompt and per-run state of the seed ideas (issue 29): hand-derived updates, and exactness after a
state_dict round trip through JSON (what a checkpoint stores): the restored object continues exactly as the
uninterrupted one."""

import json

import pytest
import torch

from rlx.algorithms.entropy_band import EntropyHistory
from rlx.algorithms.grouping import fixed_groups
from rlx.algorithms.shaping import LaserDTargets
from rlx.data.difficulty import DifficultySampler, sampling_weights
from rlx.rollout.stages.replay import ReplayBuffer, ReplayEntry, fill_buffer, replay_plan, sample_entries

T = torch.tensor


def roundtrip(state: dict) -> dict:
    return json.loads(json.dumps(state))


# --------------------------------------------------------------------------------------------------
# 8. difficulty-aware prompt sampling
# --------------------------------------------------------------------------------------------------


def test_sampling_weights_by_hand():
    """eps 0.01, p = [0, 0.5, 1]: learnability p(1-p) + eps = [0.01, 0.26, 0.01]; hard (1 - p) + eps =
    [1.01, 0.51, 0.01]; uniform [1.01] x 3; a retired prompt weighs 0."""
    p = T([0.0, 0.5, 1.0], dtype=torch.float64)
    assert sampling_weights(p, "learnability", 0.01).tolist() == pytest.approx([0.01, 0.26, 0.01])
    assert sampling_weights(p, "hard", 0.01).tolist() == pytest.approx([1.01, 0.51, 0.01])
    assert sampling_weights(p, "uniform", 0.01, T([False, True, False])).tolist() == pytest.approx([1.01, 0.0, 1.01])


def test_pass_rate_ema_and_retirement():
    """prior 0.5, eta 0.5: a solved group (rate 1) -> 0.75, then a failed one (0) -> 0.375.
    retire_after 2: prompt 1 fully solved twice in a row -> retired (never drawn again); prompt 2 solved,
    failed, solved -> its streak restarted, still drawn."""
    sampler = DifficultySampler([{"q": i} for i in range(3)], seed=0, mode="learnability", ema=0.5, prior=0.5,
                                retire_after=2)
    sampler.update([0], T([1.0]), T([True]))
    assert sampler.pass_rates[0].item() == 0.75
    sampler.update([0], T([0.0]), T([False]))
    assert sampler.pass_rates[0].item() == 0.375
    sampler.update([1, 2, 1, 2, 2], T([1.0, 1.0, 1.0, 0.0, 1.0]), T([True, True, True, False, True]))
    assert sampler.retired.tolist() == [False, True, False] and sampler.weights()[1] == 0
    assert 1 not in sampler.draw(200)


def test_learnability_sampling_prefers_prompts_near_half():
    """Direction: pass rates [0.5, 0, 1] under learnability (weights 0.26, 0.01, 0.01): prompt 0 should be
    drawn in about 0.26 / 0.28 = 93% of single draws (seeded: deterministic)."""
    sampler = DifficultySampler([{"q": i} for i in range(3)], seed=3, mode="learnability")
    sampler.pass_rates = T([0.5, 0.0, 1.0], dtype=torch.float64)
    draws = [sampler.draw(1)[0] for _ in range(2000)]
    assert draws.count(0) / 2000 > 0.85
    uniform = DifficultySampler([{"q": i} for i in range(3)], seed=3)
    assert 0.25 < [uniform.draw(1)[0] for _ in range(2000)].count(0) / 2000 < 0.42


def _drive(sampler: DifficultySampler, steps: int, start: int) -> list[list[int]]:
    """Draw 4 prompts per step and observe 4 verdicts of each, k of them correct, k depending only on the prompt and
    the step (pass rate k / 4; solved when k = 4)."""
    drawn = []
    for step in range(start, start + steps):
        rows = sampler.take(4)
        verdicts = [T([j < (r["q"] * 7 + step) % 5 for j in range(4)]) for r in rows]
        sampler.observe(rows, verdicts)
        drawn.append([r["q"] for r in rows])
    return drawn


def test_the_sampler_credits_each_observed_group_to_its_own_draw():
    """Groups observed out of order (partial rollouts finish them so) and as equal copies (a resumed pool) are
    credited to the prompt they were drawn for: prior 0.5, eta 0.5, rows 0 and 1 drawn, row 1 observed first with
    verdicts [1, 1] (-> 0.75), row 0 as a copy with [0, 1] (-> 0.5). The estimate metric is the mean prior 0.5; a
    row drawn once and observed twice is refused."""
    rows = [{"q": 0}, {"q": 1}]
    sampler = DifficultySampler(rows, seed=0, mode="hard")
    first, second = sampler.take(2)
    metrics = sampler.observe([second, dict(first)], [T([True, True]), T([False, True])])
    assert sampler.pass_rates.tolist() == [0.5 if first is rows[0] else 0.75, 0.75 if second is rows[1] else 0.5]
    assert metrics == {"sampling/drawn_pass_estimate": 0.5, "sampling/retired": 0} and sampler.drawn == []
    with pytest.raises(ValueError, match="did not hand out"):
        sampler.observe([first], [T([True])])


def test_difficulty_sampler_resumes_exactly():
    rows = [{"q": i} for i in range(30)]
    straight = DifficultySampler(rows, seed=5, mode="hard", retire_after=2)
    first = _drive(straight, 6, 0)
    state = roundtrip(straight.state_dict())
    resumed = DifficultySampler(rows, seed=999, mode="hard", retire_after=2)  # another seed: the state must win
    resumed.load_state_dict(state)
    assert _drive(resumed, 6, 6) == _drive(straight, 6, 6)
    assert torch.equal(resumed.pass_rates, straight.pass_rates) and len(first) == 6
    with pytest.raises(ValueError, match="resume with the data the run started with"):
        DifficultySampler(rows[:10], seed=5).load_state_dict(state)


# --------------------------------------------------------------------------------------------------
# 5. replay into collapsed groups
# --------------------------------------------------------------------------------------------------


def test_replay_buffer_keeps_the_newest_per_prompt_and_respects_age():
    buffer = ReplayBuffer(per_prompt=2, max_age=10)
    for step in (1, 2, 3):
        buffer.add("q", ReplayEntry([step], 1.0, True, step))
    assert [e.step for e in buffer.entries["q"]["correct"]] == [2, 3] and len(buffer) == 2
    assert buffer.newest("q", True, 13).step == 3 and buffer.newest("q", True, 14) is None  # 11 steps old
    assert buffer.newest("q", False, 3) is None and buffer.newest("other", True, 3) is None


def test_replay_plan_fills_collapsed_groups_from_the_buffer():
    """Groups of 3: g0 all wrong (key a, a correct sample buffered) -> its last row (2) gets it; g1 all wrong
    (key b, nothing buffered) -> left alone; g2 all correct (key c, a wrong sample buffered) -> only with
    trigger `tied` does its last row (8) get the wrong sample; g3 mixed -> never."""
    buffer = ReplayBuffer()
    buffer.add("a", ReplayEntry([7, 7], 1.0, True, 4))
    buffer.add("c", ReplayEntry([9], 0.0, False, 4))
    correct = T([False] * 6 + [True] * 3 + [True, False, False])
    keys = ["a", "b", "c", "d"]
    plan = replay_plan(correct, fixed_groups(12, 3), keys, buffer, step=5)
    assert [(row, entry.completion_ids) for row, entry in plan] == [(2, [7, 7])]
    plan = replay_plan(correct, fixed_groups(12, 3), keys, buffer, step=5, trigger="tied")
    assert [(row, entry.completion_ids) for row, entry in plan] == [(2, [7, 7]), (8, [9])]


def test_only_informative_groups_are_buffered_and_the_buffer_resumes_exactly():
    buffer = ReplayBuffer(per_prompt=1)
    correct = T([True, False, True, True])  # group x mixed (stored), group y all correct (not stored)
    entries = sample_entries([[1], [2], [3], [4]], T([1.0, 0.0, 1.0, 1.0]), correct, 7,
                             logprobs=[[-0.5], [-1.0], [-0.1], [-0.2]])
    stored = fill_buffer(buffer, correct, T([0, 0, 1, 1]), ["x", "y"], entries)
    assert stored == 2 and set(buffer.entries) == {"x"}
    assert buffer.newest("x", True, 7).completion_ids == [1] and buffer.newest("x", False, 7).logprobs == [-1.0]
    restored = ReplayBuffer()
    restored.load_state_dict(roundtrip(buffer.state_dict()))
    assert restored.state_dict() == buffer.state_dict()
    for target in (buffer, restored):  # the same future
        target.add("x", ReplayEntry([5], 1.0, True, 8))
    assert restored.state_dict() == buffer.state_dict()


# --------------------------------------------------------------------------------------------------
# LASER-D targets and EPO's entropy history
# --------------------------------------------------------------------------------------------------


def test_laser_d_targets_adapt_every_k_steps_and_resume_exactly():
    """adapt_every 10: step 5 does nothing (targets stay at the initial 16); step 10 recomputes them
    (the batch of test_laser_d_buckets_and_targets_by_hand -> [5, 12, 12])."""
    lengths = T([2, 3, 4, 8, 9, 10, 6, 7, 8, 9, 10, 11, 1, 1, 1, 1, 1, 1])
    correct = T([True] * 5 + [False] + [True] * 2 + [False] * 4 + [False] * 6)
    targets = LaserDTargets(16, [3, 5, 9, 12], samples_per_prompt=6, adapt_every=10, expected_correct=2)
    assert not targets.update(5, lengths, correct, fixed_groups(18, 6)) and targets.targets.tolist() == [16, 16, 16]
    assert targets.update(10, lengths, correct, fixed_groups(18, 6)) and targets.targets.tolist() == [5, 12, 12]
    restored = LaserDTargets(16, [3, 5, 9, 12], samples_per_prompt=6, adapt_every=10, expected_correct=2)
    restored.load_state_dict(roundtrip(targets.state_dict()))
    assert restored.targets.tolist() == [5, 12, 12] and restored.updated_at == 10


def test_entropy_history_means_and_exact_resume():
    """Step 1: turn 0 tokens [1, 1] (mean 1), turn 1 [2] (mean 2); step 2: turn 0 [3, 3] (mean 3).
    H_bar = [(1 + 3) / 2, 2 / 1] = [2, 2]."""
    history = EntropyHistory()
    history.update(T([[1.0, 1.0, 2.0]]), T([[0, 0, 1]]))
    history.update(T([[3.0, 3.0, 9.0]]), T([[0, 0, -1]]))
    assert history.means().tolist() == [2.0, 2.0]
    restored = EntropyHistory()
    restored.load_state_dict(roundtrip(history.state_dict()))
    assert restored.means().tolist() == [2.0, 2.0] and restored.state_dict() == history.state_dict()
