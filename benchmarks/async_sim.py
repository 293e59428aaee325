"""A row-level simulator of rlx's rollout schedules on 8, 64 and 512 GPUs: synchronous, pipeline, partial rollouts
and streaming (token-budget rounds), each against the synchronous loop at the same GPU count.

    python benchmarks/async_sim.py                  # inputs from benchmarks/results/ (see measured_inputs)
    python benchmarks/async_sim.py --push nccl      # the push at the peers' NCCL figure instead of rlx's file push,
                                                    # the engines paused while it runs (rlx's nccl publisher)
    python benchmarks/async_sim.py --push nccl-overlapped   # the same push received beside decoding (not built)
    python benchmarks/async_sim.py --round-tokens 16 --capacity 128 --json /tmp/x.json

The model. A batch is P groups of G rows (P = 512, G = 16: the batch is held fixed as GPUs grow). Each row's
completion length is drawn from the real model's natural lengths (`natural_lengths.py`). Generation runs on
engines (one GPU each for this model size). An engine holds at most `capacity` rows at once (KV cache and
max_num_seqs) and decodes them together: a decode step with b rows takes t0 (1 + b / saturation), so a step of
few rows costs almost as much as a full one (the long tail: per-token latency, which more GPUs do not shorten).
When a row ends, the next row waiting for that engine takes its place (continuous batching within what the
engine was sent). A group stays on one engine. Prefill is not modelled. The update costs a fixed time per
trained token, shared by the training GPUs (ideal data parallelism). The two costs are calibrated so that
generation takes `gen_share` of a synchronous step on 8 GPUs (0.75: the H100 figure, 68-82% of a 0.5B step).
Every time is reported relative to that 8-GPU step.

The schedules (what rlx does, or would do):
  - sync: colocated, every GPU generates the batch and then trains on it, plus a switch cost per step (weights
    loaded into the engine, its memory released and taken back).
  - sync + partial: rlx's `rollout.partial=true` (APRIL) on the same GPUs: ceil(oversample P) groups in flight;
    generation stops when P groups are complete; the P complete groups with the smallest draw index are
    trained; unfinished rows keep their tokens for the next step. Only the decode steps actually run are paid
    for, and only the trained rows' tokens are trained.
  - pipeline k: `rollout.max_staleness=k` with rollout=server: n_g GPUs generate, the rest train (the best split).
    The producer samples one batch at a time; batch b waits for the weights of update b-1-k, and the producer
    pushes them (write + the engines' reload) before it starts. The trainer updates on batch b once it is sampled
    and update b-1 is done.
  - pipeline k + partial: the same producer, each batch made by the partial rule above.
  - streaming k (token-budget rounds, the design in generation-service.md; rlx's rounds in pipeline mode below are
    this schedule but for admission): every unfinished row
    advances at most S tokens per round, all at the round's version max(0, m - k), where m is the number of
    batches formed before the round; after each round the first P complete groups in draw order form a batch
    (repeatedly). New groups enter in draw order at the start of a round, each on the engine with the fewest
    rows, while the rows in flight stay within the engines' capacity and oversample P G. A round ends when every
    engine has done its part (a barrier) and costs `round_overhead` decode steps more (the continuation request
    and its prefill). The write of new weights runs beside generation; an engine reloads when the round's
    version is newer than the one it holds, which stops it for the reload time.
  - pipeline k + rounds (built: rollout.segment_tokens in pipeline mode on a fleet): partial rollouts whose step
    advances every unfinished row at most S tokens per round (a barrier, plus the round's overhead) at the step's
    version until P groups are complete; batch b waits for its version's push as in the pipeline. A round sends
    each group's rows to the engine with the fewest rows of the round so far (rlx routes by load). Unlike
    streaming, oversample P groups are always in flight: rows beyond the engines' capacity wait in the round.
  - the same + overlap (built: rollout.server.overlap_steps): engines a step no longer needs (beyond ceil(rows
    due / per_server)) move to the next step's version and draw its fresh rows' segments meanwhile.
  The speed-up of a schedule is the synchronous loop's mean step time over the schedule's, at the same GPU count.

What it leaves out: prefill, network limits beyond the push's constant, imbalance beyond what the lengths and
the group placement make, trainer memory, data-parallel inefficiency, and the statistical cost of staleness.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import sys
from bisect import bisect_right
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
LENGTHS_FILE = RESULTS / "natural_lengths_smollm2_135m.json"
PUSH_FILE = RESULTS / "server_rollout_0.5b_shm.json"   # rlx's server push at the 0.5B shape, work_dir on /dev/shm
STEP_FILE = RESULTS / "async_vs_sync_0.5b_2x4x64.json"  # the synchronous 0.5B step measured on the same CPU
# the peers' NCCL push of a 0.5B model (0.15-0.6 s) against an H100 0.5B step (gpu_smoke_h100: 4.3-6.8 s), as
# (write, reload). nccl: the engines take part in the broadcast and generate nothing while it runs (rlx's nccl
# publisher pauses them, as the peers' do), so all of it is the engines' reload. nccl-overlapped: received beside
# decoding (weights double-buffered on the engine, not built in rlx), so all of it is a write the engines do not
# wait for. The pipeline pays write + reload on its generation path either way.
NCCL_PUSHES = {"nccl": (0.0, 0.4 / 5.0), "nccl-overlapped": (0.4 / 5.0, 0.0)}
# published figures of peers (their hardware, models, tasks): asynchronous against their synchronous runs
PEERS = [
    ("AReaL (Fu et al. 2025), fully asynchronous vs synchronous", "2.57x (2.77x in its later release)"),
    ("ROLL Flash (2025), asynchronous RLVR / agentic", "2.24x / 2.72x"),
    ("APRIL (2025), partial rollouts", "+22.5% rollout throughput (up to +44%)"),
]


@dataclass(frozen=True)
class Setup:
    """The model's inputs. Times are in decode steps of one row (t0) until `calibrate` sets the update's cost."""

    lengths: tuple[int, ...]          # natural completion lengths to draw from (tokens)
    prompts: int = 512                # P: groups per batch
    group: int = 16                   # G: rows per group
    gen_share: float = 0.75           # generation's share of a synchronous 8-GPU step (calibration)
    capacity: int = 256               # rows an engine holds at once (vLLM's max_num_seqs default)
    saturation: float = 256.0         # a decode step of b rows costs 1 + b / saturation (t0 = 1)
    oversample: float = 2.0           # partial rollouts and streaming: groups in flight <= oversample P
    round_tokens: int = 32            # S: streaming's token budget per row and round
    round_overhead: float = 2.0       # streaming: decode steps' worth of cost per round (request, prefill)
    per_server: int = 32              # overlap: rows an engine is counted to take at once when a step lends engines
                                      # (rlx's rollout.server.per_server_concurrency default)
    write: float = 0.0                # push: writing the weights (share of a synchronous 8-GPU step)
    reload: float = 0.0               # push: an engine loading them (share of a synchronous 8-GPU step)
    switch: float = 0.05              # colocated sync: switching the GPUs between training and generation (share)
    batches: int = 40                 # batches simulated; the first `warmup` are not timed
    warmup: int = 8
    seed: int = 0
    token_cost: float = field(default=0.0)  # update: t0 per trained token on one GPU (set by calibrate)
    unit: float = field(default=1.0)        # t0 per synchronous 8-GPU step (set by calibrate)


def step_time(rows: int, saturation: float) -> float:
    """One decode step of `rows` rows, in t0."""
    return 1.0 + rows / saturation


# ----------------------------------------------------------------------------------------------- one engine


def engine_run(lengths: list[int], capacity: int, saturation: float):
    """Decode rows of `lengths` tokens on one engine, admitted in order, at most `capacity` at once.

    Returns (finish, admitted, timeline): each row's finish time, each row's (admission time, decode-step count at
    admission), and the timeline as (start time, step count, step time) segments, one per stretch of constant
    rows. Example: lengths [1, 3], capacity 2, saturation 2: one step of 2 rows (2 t0), then two of 1 row
    (1.5 t0 each): finish [2, 5]."""
    n = len(lengths)
    finish, admitted, timeline = [0.0] * n, [(0.0, 0)] * n, []
    heap: list[tuple[int, int]] = []
    t, step, nxt = 0.0, 0, 0
    while nxt < n and len(heap) < capacity:
        heapq.heappush(heap, (lengths[nxt], nxt))
        nxt += 1
    while heap:
        tau = step_time(len(heap), saturation)
        end = heap[0][0]
        timeline.append((t, step, tau))
        t += (end - step) * tau
        step = end
        while heap and heap[0][0] == end:
            finish[heapq.heappop(heap)[1]] = t
        while nxt < n and len(heap) < capacity:
            admitted[nxt] = (t, step)
            heapq.heappush(heap, (step + lengths[nxt], nxt))
            nxt += 1
    return finish, admitted, timeline


def steps_by(timeline, t: float) -> int:
    """Decode steps an engine has done by time t (a step counts once it is over)."""
    i = bisect_right([seg[0] for seg in timeline], t) - 1
    if i < 0:
        return 0
    start, step, tau = timeline[i]
    return step + int((t - start) / tau + 1e-9)


def engines_of(groups: int, engines: int) -> list[int]:
    """Group j goes to engine j mod engines (in draw order)."""
    return [j % engines for j in range(groups)]


def batch_time(groups: list[list[int]], engines: int, capacity: int, saturation: float) -> float:
    """Generating whole groups (one batch, from scratch) on `engines` engines: the slowest engine's time."""
    per = [[] for _ in range(engines)]
    for j, e in enumerate(engines_of(len(groups), engines)):
        per[e].extend(groups[j])
    return max((max(engine_run(rows, capacity, saturation)[0]) for rows in per if rows), default=0.0)


# ------------------------------------------------------------------------------------------ partial rollouts


@dataclass
class Group:
    draw: int                 # draw index
    left: list[int]           # tokens still to decode, per row
    total: int                # the group's tokens when complete (what the update trains)


def partial_step(pool: list[Group], prompts: int, engines: int, capacity: int, saturation: float):
    """One partial-rollout step on `engines` engines: every unfinished row of the pool decodes until `prompts` groups
    are complete. Returns (time, trained groups in draw order, the pool left: unfinished rows keep their progress;
    complete groups beyond the P trained wait). Only the decode steps run until the stop are paid for."""
    per: list[list[tuple[int, int]]] = [[] for _ in range(engines)]   # (group index, row index)
    for j, e in enumerate(engines_of(len(pool), engines)):
        per[e].extend((j, r) for r, left in enumerate(pool[j].left) if left > 0)
    done_at = [0.0] * len(pool)                                        # a group's completion time
    runs = []
    for rows in per:
        if not rows:
            continue
        finish, admitted, timeline = engine_run([pool[j].left[r] for j, r in rows], capacity, saturation)
        runs.append((rows, finish, admitted, timeline))
        for (j, _), f in zip(rows, finish):
            done_at[j] = max(done_at[j], f)
    if len(pool) < prompts:
        raise ValueError("the pool holds fewer groups than a batch")
    stop = sorted(done_at)[prompts - 1]
    complete = [j for j in range(len(pool)) if done_at[j] <= stop]
    trained = sorted(complete, key=lambda j: pool[j].draw)[:prompts]
    for rows, finish, admitted, timeline in runs:
        done = steps_by(timeline, stop)
        for (j, r), f, (at, start) in zip(rows, finish, admitted):
            if f <= stop:
                pool[j].left[r] = 0
            elif at <= stop:
                pool[j].left[r] -= max(0, done - start)
    chosen = set(trained)
    return stop, [pool[j] for j in trained], [g for j, g in enumerate(pool) if j not in chosen]


# ------------------------------------------------------------------------------------------ streaming rounds


def round_time(advances: list[int], saturation: float) -> float:
    """One engine's round: every row decodes its advance (min(S, tokens left)) together; rows drop out as they
    finish. Example: advances [1, 3], saturation 2: 1 step of 2 rows (2 t0) + 2 steps of 1 row (1.5 t0) = 5."""
    t, done, rows = 0.0, 0, len(advances)
    for a in sorted(advances):
        if a > done:
            t += (a - done) * step_time(rows, saturation)
            done = a
        rows -= 1
    return t


def streaming_rounds(draw_group, prompts: int, group: int, engines: int, capacity: int, saturation: float,
                     budget: int, oversample: float, overhead: float, batches: int):
    """The token-budget rounds, which depend on token counts only (not on time or staleness). draw_group(i) gives
    group i's row lengths. Returns one (round time in t0, [tokens of each batch formed after the round]) per round,
    until `batches` batches are formed."""
    flight: list[tuple[Group, int]] = []                 # (group, engine), unfinished or complete and untrained
    load = [0] * engines                                 # unfinished rows per engine
    next_draw, formed, rounds = 0, 0, []
    max_groups = max(prompts, math.ceil(oversample * prompts))
    while formed < batches:
        while len(flight) < max_groups:                  # admission in draw order, least-loaded engine
            e = min(range(engines), key=load.__getitem__)
            if load[e] + group > capacity and flight:
                break
            lengths = draw_group(next_draw)
            flight.append((Group(next_draw, list(lengths), sum(lengths)), e))
            load[e] += group
            next_draw += 1
        advances: list[list[int]] = [[] for _ in range(engines)]
        for g, e in flight:
            for r, left in enumerate(g.left):
                if left > 0:
                    a = min(budget, left)
                    advances[e].append(a)
                    g.left[r] = left - a
                    if g.left[r] == 0:
                        load[e] -= 1
        elapsed = max(round_time(a, saturation) for a in advances if a) + overhead if any(advances) else 0.0
        made = []
        while True:
            complete = sorted((g.draw, i) for i, (g, _) in enumerate(flight) if not any(g.left))
            if len(complete) < prompts:
                break
            take = {i for _, i in complete[:prompts]}
            made.append(sum(flight[i][0].total for i in take))
            flight = [x for i, x in enumerate(flight) if i not in take]
        formed += len(made)
        rounds.append((elapsed, made))
    return rounds


# ------------------------------------------------------- rlx's rounds in pipeline mode, with and without overlap


def step_rounds(draw_group, prompts: int, oversample: float, budget: int, batches: int) -> list[dict]:
    """The logical rounds of rlx's partial rollouts in rounds (rollout.segment_tokens), which depend on token counts
    only: per step, {"fresh": draw indices drawn at the step, "rounds": [{(draw, row): advance}], "tokens": trained
    tokens}. A step's rounds go on until `prompts` groups are complete; the first complete ones in draw order are
    trained, the rest (and every unfinished row, with its progress) wait in the pool."""
    pool: dict[int, Group] = {}
    nxt, steps = 0, []
    for _ in range(batches):
        fresh = []
        while len(pool) < max(prompts, math.ceil(oversample * prompts)):
            lengths = draw_group(nxt)
            pool[nxt] = Group(nxt, list(lengths), sum(lengths))
            fresh.append(nxt)
            nxt += 1
        rounds = []
        while sum(not any(g.left) for g in pool.values()) < prompts:
            advances = {}
            for g in pool.values():
                for r, left in enumerate(g.left):
                    if left > 0:
                        advances[(g.draw, r)] = min(budget, left)
                        g.left[r] = left - advances[(g.draw, r)]
            rounds.append(advances)
        trained = sorted(d for d, g in pool.items() if not any(g.left))[:prompts]
        steps.append({"fresh": fresh, "rounds": rounds, "tokens": sum(pool[d].total for d in trained)})
        for d in trained:
            del pool[d]
    return steps


def lane_round(advances: dict, engines: int, capacity: int, saturation: float, overhead: float) -> float:
    """One barrier round of `advances` ({(draw, row): tokens}) on `engines` engines: the slowest engine's time plus
    the round's overhead (0 with nothing to draw). A group's rows go to one engine; groups in draw order each to the
    engine with the fewest rows of the round so far (lowest index on a tie), as rlx's fleet sends a group's
    requests to the least-loaded server (ServerClient.routed)."""
    if not advances:
        return 0.0
    groups: dict[int, list[int]] = {}
    for (draw, _), a in sorted(advances.items()):
        groups.setdefault(draw, []).append(a)
    per: list[list[int]] = [[] for _ in range(engines)]
    loads = [(0, e) for e in range(engines)]  # (rows so far, engine): a heap
    for draw in sorted(groups):
        rows, e = heapq.heappop(loads)
        per[e].extend(groups[draw])
        heapq.heappush(loads, (rows + len(groups[draw]), e))
    return max(max(engine_run(rows, capacity, saturation)[0]) for rows in per if rows) + overhead


def rounds_pipeline_time(setup: Setup, steps: list[dict], engines: int, trainers: int, staleness: int,
                         overlap: bool) -> float:
    """Mean step of rlx's pipeline with partial rollouts in rounds (`step_rounds`), batch b sampled with version
    max(0, b-1-k) pushed before it (write after its update, then the engines' reload). With overlap
    (rollout.server.overlap_steps): at each round of step b, the engines beyond ceil(rows due / per_server) (never
    the last) move to step b+1's version once it is written (their reload beside the round) and draw segments of
    step b+1's fresh rows there, at most per_server rows an engine at once, the rows with the fewest rounds first,
    until step b's rounds end (a call still in flight then is dropped, not waited for); step b+1 then draws only
    the segments the lane has finished. Left out: the lane's segments past step b+1's last round (the
    implementation may draw and drop them), and a lane while both steps sample with the same weights (the
    implementation shares every server then)."""
    write, reload, overhead = setup.write * setup.unit, setup.reload * setup.unit, setup.round_overhead
    cap, sat, per = setup.capacity, setup.saturation, setup.per_server
    n = len(steps)
    updated, producer, held, ahead = [0.0] * (n + 1), 0.0, 0, {}
    for b in range(1, n + 1):
        step, need = steps[b - 1], max(0, b - 1 - staleness)
        t = max(producer, updated[need] + write if need else 0.0)
        if need > held:
            t, held = t + reload, need
        lane_engines, lane_t, lane_version, progress = 0, 0.0, max(0, b - staleness), {}
        plan: dict[tuple[int, int], list[int]] = {}  # step b+1's fresh rows: their advance in each of its rounds
        if overlap and b < n:
            fresh = set(steps[b]["fresh"])
            for advances in steps[b]["rounds"]:
                for key, a in advances.items():
                    if key[0] in fresh:
                        plan.setdefault(key, []).append(a)
        for r, advances in enumerate(step["rounds"]):
            due = {k: a for k, a in advances.items() if ahead.get(k, 0) <= r}
            if plan and lane_version != need and (not lane_version or updated[lane_version] + write <= t):
                spare = engines - lane_engines - max(1, math.ceil(len(due) / per))
                if spare > 0:
                    lane_t = max(lane_t, t) + reload  # the moved engines reload (beside this round)
                    lane_engines += spare
            t += lane_round(due, engines - lane_engines, cap, sat, overhead)
            while lane_engines and lane_t < t:  # the lane's calls meanwhile
                left = sorted((progress.get(k, 0), k) for k, a in plan.items() if progress.get(k, 0) < len(a))
                if not left:
                    break
                wave = {k: plan[k][done] for done, k in left[: lane_engines * per]}
                lane_t += lane_round(wave, lane_engines, cap, sat, overhead)
                if lane_t <= t or r + 1 < len(step["rounds"]):  # a call past the step's end is dropped
                    for k in wave:
                        progress[k] = progress.get(k, 0) + 1
        producer = t
        ahead = progress
        updated[b] = max(producer, updated[b - 1]) + update_time(setup, step["tokens"], trainers)
    return (updated[n] - updated[setup.warmup]) / (n - setup.warmup)


# ------------------------------------------------------------------------------------------ the schedules


def draws(setup: Setup):
    """Group i's row lengths: a fixed function of (seed, i), so every schedule sees the same rows in draw order."""
    def draw_group(i: int) -> list[int]:
        rng = random.Random(setup.seed * 1_000_003 + i)
        return [rng.choice(setup.lengths) for _ in range(setup.group)]
    return draw_group


def update_time(setup: Setup, tokens: int, gpus: int) -> float:
    return setup.token_cost * tokens / gpus


def sync_steps(setup: Setup, gpus: int, partial: bool = False) -> float:
    """Mean step of the colocated synchronous loop (every GPU generates, then trains), in t0."""
    switch = setup.switch * setup.unit
    times = [gen + update_time(setup, tokens, gpus) + switch for gen, tokens in producer_batches(setup, gpus, partial)]
    return sum(times[setup.warmup:]) / (setup.batches - setup.warmup)


def producer_batches(setup: Setup, engines: int, partial: bool) -> list[tuple[float, int]]:
    """(generation time, trained tokens) of each batch the one-batch-at-a-time producer makes."""
    draw_group, P, out, pool, nxt = draws(setup), setup.prompts, [], [], 0
    for b in range(setup.batches):
        if partial:
            while len(pool) < math.ceil(setup.oversample * P):
                lengths = draw_group(nxt)
                pool.append(Group(nxt, list(lengths), sum(lengths)))
                nxt += 1
            gen, trained, pool = partial_step(pool, P, engines, setup.capacity, setup.saturation)
            out.append((gen, sum(g.total for g in trained)))
        else:
            groups = [draw_group(b * P + j) for j in range(P)]
            out.append((batch_time(groups, engines, setup.capacity, setup.saturation), sum(map(sum, groups))))
    return out


def pipeline_time(setup: Setup, made: list[tuple[float, int]], trainers: int, staleness: int) -> float:
    """Mean step of rlx's pipeline: batch b waits for update b-1-k, whose push (write + reload) the producer does
    before sampling it; the trainer updates on batch b once it is sampled and update b-1 is done."""
    n, push = len(made), (setup.write + setup.reload) * setup.unit
    updated, producer, held = [0.0] * (n + 1), 0.0, 0
    for b in range(1, n + 1):
        need = max(0, b - 1 - staleness)
        start = max(producer, updated[need] if need else 0.0)
        if need > held:
            start, held = start + push, need
        producer = start + made[b - 1][0]
        updated[b] = max(producer, updated[b - 1]) + update_time(setup, made[b - 1][1], trainers)
    return (updated[n] - updated[setup.warmup]) / (n - setup.warmup)


def streaming_time(setup: Setup, rounds, trainers: int, staleness: int) -> float:
    """Mean step of streaming: round r runs at version max(0, m - k) (m batches formed before it), once that version
    is written (write after its update) and reloaded by the engines (reload when the version changes)."""
    write, reload = setup.write * setup.unit, setup.reload * setup.unit
    updated, t, held = [0.0], 0.0, 0
    for elapsed, made in rounds:
        need = max(0, len(updated) - 1 - staleness)
        if need:
            t = max(t, updated[need] + write)
        if need > held:
            t, held = t + reload, need
        t += elapsed
        for tokens in made:
            updated.append(max(t, updated[-1]) + update_time(setup, tokens, trainers))
    n = min(len(updated) - 1, setup.batches)
    return (updated[n] - updated[setup.warmup]) / (n - setup.warmup)


def calibrate(setup: Setup) -> Setup:
    """Set the update's cost per token so that generation is gen_share of a synchronous 8-GPU step, and the unit."""
    draw_group, P = draws(setup), setup.prompts
    gen = tokens = 0.0
    n = min(setup.batches, 10)
    for b in range(n):
        groups = [draw_group(b * P + j) for j in range(P)]
        gen += batch_time(groups, 8, setup.capacity, setup.saturation) / n
        tokens += sum(map(sum, groups)) / n
    update = gen * (1 - setup.gen_share) / setup.gen_share
    return replace(setup, token_cost=update * 8 / tokens, unit=gen / setup.gen_share)


def bound_time(setup: Setup, gpus: int) -> float:
    """No schedule beats this step (t0): every GPU busy all the time, generating at full capacity (step time
    1 + C / saturation for C rows) or training; no tail, push or switch. Mean tokens of a batch: P G mean length."""
    tokens = setup.prompts * setup.group * sum(setup.lengths) / len(setup.lengths)
    return tokens * (step_time(setup.capacity, setup.saturation) / setup.capacity + setup.token_cost) / gpus


def splits(gpus: int) -> list[int]:
    """Generating-GPU counts tried for the disaggregated schedules: every count on 8 GPUs, else from half the GPUs
    up in sixteenths (generation is most of the work, so the best split gives it more than half)."""
    if gpus <= 8:
        return list(range(1, gpus))
    step = gpus // 16
    return list(range(gpus // 2, gpus, step))


def compare(setup: Setup, gpus: int, stalenesses=(1, 2, 4)) -> list[dict]:
    """Every schedule's speed-up over the synchronous loop on `gpus` GPUs, at each staleness (best split each)."""
    sync = sync_steps(setup, gpus)
    sync_partial = sync_steps(setup, gpus, partial=True)
    produced = {(e, p): producer_batches(setup, e, p) for e in splits(gpus) for p in (False, True)}
    streamed = {e: streaming_rounds(draws(setup), setup.prompts, setup.group, e, setup.capacity, setup.saturation,
                                    setup.round_tokens, setup.oversample, setup.round_overhead, setup.batches)
                for e in splits(gpus)}
    stepped = step_rounds(draws(setup), setup.prompts, setup.oversample, setup.round_tokens, setup.batches)
    rows = []
    for k in stalenesses:
        best = {}
        for name, runs in (("pipeline", False), ("pipeline_partial", True)):
            best[name] = min((pipeline_time(setup, produced[(e, runs)], gpus - e, k), e) for e in splits(gpus))
        best["streaming"] = min((streaming_time(setup, streamed[e], gpus - e, k), e) for e in splits(gpus))
        best["pipeline_rounds"] = min((rounds_pipeline_time(setup, stepped, e, gpus - e, k, False), e)
                                      for e in splits(gpus))
        split = best["pipeline_rounds"][1]  # overlap: at the split best without it (the lane's model is slow)
        best["pipeline_rounds_overlap"] = (rounds_pipeline_time(setup, stepped, split, gpus - split, k, True), split)
        row = {"gpus": gpus, "staleness": k, "sync_step": sync / setup.unit,
               "sync_partial": sync / sync_partial, "bound": sync / bound_time(setup, gpus)}
        for name, (time, e) in best.items():
            row[name] = sync / time
            row[name + "_generating_gpus"] = e
        row["streaming_staleness_bound"] = k + math.ceil(max(setup.lengths) / setup.round_tokens) - 1
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------------------ inputs and output


def measured_inputs() -> dict:
    """The measured inputs, each with where it came from: the natural lengths (natural_lengths.py), and rlx's push
    against the synchronous 0.5B step on the same 2-core CPU (server_rollout_0.5b_shm.json: write and reload
    medians, /dev/shm; async_vs_sync_0.5b_2x4x64.json: the synchronous step)."""
    out: dict = {}
    if LENGTHS_FILE.is_file():
        record = json.loads(LENGTHS_FILE.read_text())
        out["lengths"] = {name: s["lengths"] for name, s in record["sets"].items()}
        out["lengths_source"] = f"{LENGTHS_FILE.name}: {record['model']}, T={record['temperature']}, " \
                                f"max {record['max_new_tokens']} new tokens, {record['prompts']} prompts per set"
    if PUSH_FILE.is_file() and STEP_FILE.is_file():
        publish = json.loads(PUSH_FILE.read_text())["publish"]
        step = json.loads(STEP_FILE.read_text())["summary"]["sync"]["step_s"]
        out["write"], out["reload"] = publish["write_median_s"] / step, publish["reload_median_s"] / step
        out["push_source"] = f"{PUSH_FILE.name} (write {publish['write_median_s']:.1f} s, reload " \
                             f"{publish['reload_median_s']:.1f} s) / {STEP_FILE.name} (sync step {step:.1f} s)"
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="gsm_symbolic",
                        help="which measured length set (gsm_symbolic | chain_sum)")
    parser.add_argument("--push", default="rlx", choices=["rlx", *NCCL_PUSHES], help="rlx: its file push, measured; "
                        "nccl: the peers' figure, engines paused while it runs; nccl-overlapped: the same received "
                        "beside decoding")
    parser.add_argument("--gpus", default="8,64,512")
    parser.add_argument("--gen-share", type=float, default=0.75)
    parser.add_argument("--capacity", type=int, default=256)
    parser.add_argument("--saturation", type=float, default=256.0)
    parser.add_argument("--round-tokens", type=int, default=32)
    parser.add_argument("--switch", type=float, default=0.05)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--json", help="also write inputs and table as JSON here")
    args = parser.parse_args(argv)
    measured = measured_inputs()
    if "lengths" not in measured:
        raise SystemExit(f"no natural lengths: run benchmarks/natural_lengths.py (writes {LENGTHS_FILE})")
    write, reload = (measured["write"], measured["reload"]) if args.push == "rlx" else NCCL_PUSHES[args.push]
    setup = calibrate(Setup(lengths=tuple(measured["lengths"][args.lengths]), gen_share=args.gen_share,
                            capacity=args.capacity, saturation=args.saturation, round_tokens=args.round_tokens,
                            write=write, reload=reload, switch=args.switch, batches=args.batches))
    inputs = {k: v for k, v in asdict(setup).items() if k != "lengths"}
    inputs.update(lengths_set=args.lengths, lengths_mean=sum(setup.lengths) / len(setup.lengths),
                  lengths_max=max(setup.lengths), push=args.push,
                  lengths_source=measured["lengths_source"],
                  push_source=measured.get("push_source", "") if args.push == "rlx" else
                  "peers' NCCL push of a 0.5B model (0.15-0.6 s) against a 5 s H100 0.5B step (gpu_smoke_h100)" +
                  (", engines paused for it" if args.push == "nccl" else ", received beside decoding"))
    print("assumptions: " + ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                                      for k, v in inputs.items()))
    table = [row for n in map(int, args.gpus.split(",")) for row in compare(setup, n)]
    header = ["GPUs", "k", "sync + partial", "pipeline (gen GPUs)", "pipeline + partial", "pipeline + rounds",
              "pipeline + rounds + overlap", "streaming (gen GPUs)", "bound"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in table:
        lines.append(f"| {r['gpus']} | {r['staleness']} | {r['sync_partial']:.2f}x | {r['pipeline']:.2f}x "
                     f"({r['pipeline_generating_gpus']}) | {r['pipeline_partial']:.2f}x | {r['pipeline_rounds']:.2f}x "
                     f"| {r['pipeline_rounds_overlap']:.2f}x | {r['streaming']:.2f}x "
                     f"({r['streaming_generating_gpus']}) | {r['bound']:.2f}x |")
    print("\n".join(lines))
    print("\npublished by peers (their hardware, models, tasks): " + "; ".join(f"{a}: {b}" for a, b in PEERS))
    record = {"inputs": inputs, "table": table, "peers": dict(PEERS)}
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    return record


if __name__ == "__main__":
    sys.exit(main() and 0)
