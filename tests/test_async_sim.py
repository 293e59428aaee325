"""benchmarks/async_sim.py against hand-derived numbers: one engine's decode, partial rollouts' accounting, a tiny
schedule of streaming rounds, and the timing of each schedule."""

import math

import pytest

from benchmarks import async_sim as sim

FLAT = math.inf  # saturation: every decode step costs 1 t0, whatever its rows


def test_engine_run_continuous_batching_by_hand():
    """Lengths [1, 3], capacity 2, saturation 2: a step of 2 rows costs 2, of 1 row 1.5. Both start: row 0 ends
    after 1 step (t = 2), row 1 decodes 2 more steps alone (t = 2 + 3 = 5). Capacity 1: row 0 alone (1.5),
    then row 1 alone (3 x 1.5 = 4.5): 6.0, admitted at t = 1.5 after 1 step."""
    finish, admitted, timeline = sim.engine_run([1, 3], 2, 2.0)
    assert finish == [2.0, 5.0]
    assert timeline == [(0.0, 0, 2.0), (2.0, 1, 1.5)]
    assert sim.steps_by(timeline, 1.9) == 0 and sim.steps_by(timeline, 2.0) == 1 and sim.steps_by(timeline, 3.5) == 2
    finish, admitted, _ = sim.engine_run([1, 3], 1, 2.0)
    assert finish == [1.5, 6.0] and admitted[1] == (1.5, 1)


def test_partial_rollouts_pay_only_the_steps_run_and_train_the_whole_rows():
    """One engine, flat steps, P = 1 group of 1 row. Pool: A (draw 0, 10 tokens), B (draw 1, 2 tokens). Step 1 stops
    when B completes: 2 steps; B is trained (2 tokens); A has 8 left. Add C (draw 2, 10): step 2 stops when A
    completes, 8 steps later; A is trained with all its 10 tokens; C keeps 2 left. Total 10 steps for 12 tokens
    trained, against 10 + 2 = 12 steps for the one-batch producer on A then B. The old model cut the tail share
    and gave it back as throughput work; here no decode step is counted that was not run, and none is lost."""
    pool = [sim.Group(0, [10], 10), sim.Group(1, [2], 2)]
    time, trained, pool = sim.partial_step(pool, 1, 1, 4, FLAT)
    assert time == 2.0 and [g.draw for g in trained] == [1] and [g.total for g in trained] == [2]
    assert [(g.draw, g.left) for g in pool] == [(0, [8])]
    pool.append(sim.Group(2, [10], 10))
    time, trained, pool = sim.partial_step(pool, 1, 1, 4, FLAT)
    assert time == 8.0 and [g.total for g in trained] == [10] and [(g.draw, g.left) for g in pool] == [(2, [2])]


def test_partial_rollouts_train_the_smallest_draw_indices_among_the_complete():
    """P = 1: B (draw 1, 1 token) and C (draw 2, 1 token) complete at the stop (after 1 step, A still running); B is
    trained (smaller draw index), C waits complete, A keeps its progress (4 - 1 = 3 left)."""
    pool = [sim.Group(0, [4], 4), sim.Group(1, [1], 1), sim.Group(2, [1], 1)]
    time, trained, pool = sim.partial_step(pool, 1, 1, 8, FLAT)
    assert time == 1.0 and [g.draw for g in trained] == [1]
    assert [(g.draw, g.left) for g in pool] == [(0, [3]), (2, [0])]


def test_partial_rollouts_without_oversampling_equal_the_whole_batch():
    """oversample 1: the pool is the batch, the stop is when its last group completes: the same step as sync."""
    setup = sim.calibrate(sim.Setup(lengths=(3, 7, 20, 40), prompts=8, group=2, oversample=1.0, batches=6, warmup=1))
    assert sim.sync_steps(setup, 8, partial=True) == pytest.approx(sim.sync_steps(setup, 8))


def test_calibration_makes_the_synchronous_8_gpu_step_one_unit():
    setup = sim.calibrate(sim.Setup(lengths=(3, 7, 20, 40), prompts=8, group=2, switch=0.0, batches=10, warmup=0))
    assert sim.sync_steps(setup, 8) / setup.unit == pytest.approx(1.0)


def test_round_time_by_hand():
    """Advances [1, 3], saturation 2: 1 step of 2 rows (2) + 2 steps of 1 row (2 x 1.5) = 5."""
    assert sim.round_time([1, 3], 2.0) == 5.0
    assert sim.round_time([2, 2, 2], FLAT) == 2.0


def test_streaming_rounds_on_a_tiny_schedule():
    """P = 1 group of 1 row, one engine, S = 2 tokens per round, at most 2 groups in flight, flat steps. Lengths by
    draw: 3, 1, 2, 4. Round 1 admits g0 (3) and g1 (1): advances 2 and 1, 2 steps; g1 completes: batch 1 = g1
    (1 token). Round 2 admits g2 (2): g0 advances its last 1, g2 its 2: 2 steps; g0 and g2 complete: batch 2 = g0
    (3 tokens, first in draw order), batch 3 = g2 (2 tokens)."""
    lengths = [3, 1, 2, 4, 5, 6]
    rounds = sim.streaming_rounds(lambda i: [lengths[i]], 1, 1, 1, 4, FLAT, 2, 2.0, 0.0, 3)
    assert rounds == [(2.0, [1]), (2.0, [3, 2])]


def test_streaming_timing_by_hand():
    """The rounds above, 1 t0 per trained token on one trainer. k = 1: round 2 needs version max(0, 1 - 1) = 0:
    t = 2 + 2 = 4; update 1 ends 2 + 1 = 3, update 2 at max(4, 3) + 3 = 7, update 3 at 7 + 2 = 9: 3 per step.
    k = 0: round 2 needs version 1 (ready at 3): 3 + 2 = 5; updates end 3, 8, 10. With write 0.5 and reload 0.25:
    round 2 starts at 3 + 0.5 + 0.25 = 3.75, ends 5.75; updates end 3, 8.75, 10.75."""
    rounds = [(2.0, [1]), (2.0, [3, 2])]
    setup = sim.Setup(lengths=(1,), token_cost=1.0, unit=1.0, batches=3, warmup=0)
    assert sim.streaming_time(setup, rounds, 1, 1) == pytest.approx(9 / 3)
    assert sim.streaming_time(setup, rounds, 1, 0) == pytest.approx(10 / 3)
    pushed = sim.Setup(lengths=(1,), token_cost=1.0, unit=1.0, batches=3, warmup=0, write=0.5, reload=0.25)
    assert sim.streaming_time(pushed, rounds, 1, 0) == pytest.approx(10.75 / 3)


def test_pipeline_timing_by_hand():
    """Three batches of 2 t0 generation and 1 token each, k = 1: batch 1 sampled at 2, update 1 ends 3; batch 2 (needs
    version 0) sampled at 4, update 2 at 5; batch 3 needs version 1 (at 3): sampled at 6, update 3 at 7. A push of
    1 (write + reload) before batch 3: sampled at 7, update 3 at 8."""
    made = [(2.0, 1), (2.0, 1), (2.0, 1)]
    setup = sim.Setup(lengths=(1,), token_cost=1.0, unit=1.0, batches=3, warmup=0)
    assert sim.pipeline_time(setup, made, 1, 1) == pytest.approx(7 / 3)
    pushed = sim.Setup(lengths=(1,), token_cost=1.0, unit=1.0, batches=3, warmup=0, write=0.75, reload=0.25)
    assert sim.pipeline_time(pushed, made, 1, 1) == pytest.approx(8 / 3)


def test_compare_runs_end_to_end_on_a_small_setup():
    setup = sim.calibrate(sim.Setup(lengths=(3, 7, 20, 40), prompts=8, group=2, batches=8, warmup=2))
    rows = sim.compare(setup, 8, stalenesses=(1,))
    assert rows[0]["gpus"] == 8 and all(rows[0][k] > 0 for k in ("pipeline", "pipeline_partial", "streaming"))


def test_bound_by_hand():
    """Lengths (10, 30): mean 20; 2 groups of 2 rows: 80 tokens a batch. Capacity 4, saturation 4: a full step
    costs 2 t0 for 4 tokens (0.5 a token); update 0.25 a token: 80 x 0.75 / 2 GPUs = 30."""
    setup = sim.Setup(lengths=(10, 30), prompts=2, group=2, capacity=4, saturation=4.0, token_cost=0.25)
    assert sim.bound_time(setup, 2) == pytest.approx(30.0)


def test_step_rounds_by_hand():
    """Groups of 2 rows, lengths drawn in order: g0 (3, 9), g1 (2, 2), g2 (9, 9); 1 group a step, 2 in flight,
    rounds of 4 tokens. Step 1 (g0, g1): round 0 finishes g1 (2 + 2 tokens) and moves g0 to (done, 5 left): g1
    trained. Step 2 draws g2: round 0 advances g0's row 1 by 4 and g2 by 4 + 4; round 1: g0 done (1 token) ->
    trained (12 tokens)."""
    lengths = {0: [3, 9], 1: [2, 2], 2: [9, 9]}
    steps = sim.step_rounds(lambda i: lengths[i], prompts=1, oversample=2.0, budget=4, batches=2)
    assert [s["fresh"] for s in steps] == [[0, 1], [2]]
    assert steps[0]["rounds"] == [{(0, 0): 3, (0, 1): 4, (1, 0): 2, (1, 1): 2}] and steps[0]["tokens"] == 4
    assert steps[1]["rounds"] == [{(0, 1): 4, (2, 0): 4, (2, 1): 4}, {(0, 1): 1, (2, 0): 4, (2, 1): 4}]
    assert steps[1]["tokens"] == 12


def test_a_round_places_each_group_on_the_least_loaded_engine_by_hand():
    """lane_round, 2 engines, saturation 2, overhead 1: g0 (rows advancing 4, 4) goes to engine 0, g1 (2) to engine
    1, g2 (3) to engine 1 (1 row there against 2). Engine 0: 4 steps of 2 rows (2 t0 each) = 8; engine 1: 2 steps of
    2 rows + 1 of 1 row (1.5) = 5.5. The round: 8 + 1 = 9 (by draw index mod engines, g2 would join g0: 10.5)."""
    advances = {(0, 0): 4, (0, 1): 4, (1, 0): 2, (2, 0): 3}
    assert sim.lane_round(advances, 2, 8, 2.0, 1.0) == pytest.approx(9.0)
    assert sim.lane_round({}, 2, 8, 2.0, 1.0) == 0.0


def test_overlap_in_the_model_needs_an_engine_to_spare():
    """rounds_pipeline_time: with one generating engine nothing can move ahead, so overlap changes nothing; with 12,
    a lane runs (the time changes) and, where rounds cost a row's latency more than their rows, it neither gains
    nor loses much: fewer rows per round do not make the round shorter, and the engines the lane takes make the
    current step's slightly slower (within 1% here)."""
    setup = sim.calibrate(sim.Setup(lengths=(3, 7, 20, 40), prompts=8, group=2, batches=8, warmup=2,
                                    round_tokens=8, per_server=4))
    steps = sim.step_rounds(sim.draws(setup), setup.prompts, setup.oversample, setup.round_tokens, setup.batches)
    assert sim.rounds_pipeline_time(setup, steps, 1, 50, 2,
                                    True) == sim.rounds_pipeline_time(setup, steps, 1, 50, 2, False)
    over, plain = (sim.rounds_pipeline_time(setup, steps, 12, 50, 2, o) for o in (True, False))
    assert over != plain and abs(over / plain - 1) < 0.01
