"""Rounds that overlap across steps on servers of two weight versions (rollout.server.overlap_steps,
rlx/fleet/overlap.py, rlx/rollout/pool.py): the round record and the cut-back of rows drawn past a step's last round,
on hand-built groups; a partial-rollout producer over a fleet of version-sensitive fake servers (tests/fake_vllm.py:
a row drawn by a server of the wrong version differs) draws the same rows, journal and versions with and without
overlap while the next step's rounds run on servers moved ahead; a lost server of the current version brings the
fleet back; a training run in pipeline mode ends with the same weights, bit for bit; the config rules."""

from __future__ import annotations

import json

import pytest
import torch

from rlx.engines.lane import NoLane
from rlx.errors import NoServerAtVersion
from rlx.fleet.overlap import StepOverlap, rows_answered
from rlx.rewards import RewardComponent
from rlx.rollout.partial import PartialProducer
from rlx.rollout.pool import GroupInFlight, groups_completed, round_tokens, settle
from rlx.rollout.rounds import Rounds
from rlx.rollout.single_turn import SingleTurnSettings
from tests.test_partial import InOrder
from tests.test_server_unit import build


@pytest.fixture(scope="module")
def tiny():
    from rlx.models.loading import load_causal_lm, load_tokenizer

    return load_causal_lm("builtin:tiny"), load_tokenizer("builtin:tiny")


def group_with(rows: list[tuple[list[int], bool]], marks: list[list[int]]) -> GroupInFlight:
    """A group whose row i has tokens rows[i][0] (finished: rows[i][1]) and round record marks[i]."""
    group = GroupInFlight.drawn(0, {}, "p", [1], [5] * len(rows))
    for i, (ids, finished) in enumerate(rows):
        group.ids[i], group.logprobs[i] = list(ids), [-0.5] * len(ids)
        group.token_versions[i] = [3] * len(ids)
        group.versions[i] = 3 if ids else None
        group.finished[i] = group.stopped[i] = finished
    group.marks, group.marks_step = [list(m) for m in marks], 2
    return group


def test_the_round_record_says_what_each_round_drew_and_who_had_finished():
    """Row 0 began the step with 2 tokens and finished in round 1 (2 -> 4 -> 5); row 1 was drawn ahead for three
    rounds and finished in round 2 (0 -> 2 -> 4 -> 5)."""
    group = group_with([([9] * 5, True), ([8] * 5, True)], [[2, 4, 5], [0, 2, 4, 5]])
    assert [group.finished_by(0, r) for r in (-1, 0, 1, 2)] == [False, False, True, True]
    assert [group.finished_by(1, r) for r in (0, 1, 2)] == [False, False, True]
    assert [groups_completed([group], r) for r in (0, 1, 2)] == [0, 0, 1]
    assert (round_tokens([group], 0) == (4, 2) and round_tokens([group], 1) == (3, 2)
            and round_tokens([group], 2) == (1, 1))
    group.start_marks(2)  # begun for this step already (by the lane): kept
    assert group.marks[1] == [0, 2, 4, 5]
    group.start_marks(3)
    assert group.marks == [[5], [5]]


def test_rows_drawn_past_the_last_round_are_cut_back_to_it():
    """The step ends after round 0: row 1, drawn ahead to its finish in round 2, goes back to its 2 tokens of round
    0, unfinished, with its log-probs and per-token versions; row 0 (finished in round 1) likewise; a row with
    nothing left after the cut loses its first-token version, a group with nothing left its first step."""
    group = group_with([([9] * 5, True), ([8] * 5, True), ([7] * 3, False)], [[2, 4, 5], [0, 2, 4, 5], [0, 0, 3]])
    ahead = group_with([([6] * 2, False), ([5] * 2, False)], [[0, 2], [0, 2]])  # drawn ahead, none of it kept
    group.first_step = ahead.first_step = 2
    assert settle([ahead], -1) == 4 and ahead.ids == [[], []] and ahead.first_step is None
    assert settle([group], 0) == (5 - 4) + (5 - 2) + 3 and group.first_step == 2
    assert group.ids == [[9] * 4, [8] * 2, []] and group.logprobs[1] == [-0.5] * 2
    assert group.token_versions == [[3] * 4, [3] * 2, []] and group.versions == [3, 3, None]
    assert group.finished == [False] * 3 and group.stopped == [False] * 3
    assert group.marks == [[2, 4], [0, 2], [0, 0]]
    assert settle([group], 0) == 0  # nothing past round 0 any more


PROMPTS = [f"{a} + {b} =" for a, b in zip(range(1, 30), range(30, 1, -1))]


def partial_producer(generator, tokenizer, journal, *, steps=4, segment=2, lane=None):
    """2 groups of 2 per step, 4 in flight, rows of up to 16 tokens in rounds of `segment` (the rows each server
    answered in the journal), the next step's lent to `lane` (None: none); reward: the length."""
    stream = InOrder([{"prompt": p, "answer": "x"} for p in PROMPTS], seed=0)
    rewards = [RewardComponent("task", lambda prompts, completions, **_: [float(len(c)) for c in completions], 1.0)]
    settings = SingleTurnSettings(group_size=2, prompts_per_step=2, max_new_tokens=16, min_new_tokens=0, seed=3,
                                  use_chat_template=False, system_prompt=None, on_error="raise", accuracy_key="task",
                                  total_steps=steps)
    return PartialProducer(generator, tokenizer, stream, rewards, settings, oversample=2.0,
                           rounds=Rounds(segment, journal, rows_answered(generator), lane or NoLane()))


def sampled(batch) -> list:
    r = batch.rollout
    return [r.completion_ids.tolist(), r.completion_mask.tolist(), r.logprobs.tolist(),
            r.token_versions.tolist(), batch.rewards.tolist()]


def logical(journal) -> list[dict]:
    """The journal's lines without their information-only fields."""
    return [{k: v for k, v in json.loads(x).items() if k not in ("served", "drawn_ahead")}
            for x in journal.read_text().splitlines()]


def run_steps(urls, tiny, tmp_path, name, *, overlap: bool, steps=4):
    """Steps 1..steps of the producer on the fleet at `urls`, step s sampled with weight version s-1 (published
    before it, as the pipeline does); with overlap, step s+1's weights are ready during step s."""
    model, tok = tiny
    gen = build(urls, model, tok, tmp_path / name, per_server_concurrency=32)
    lane = StepOverlap(gen, lambda step: (step - 1, model), per_server=32) if overlap else None
    made = partial_producer(gen, tok, tmp_path / f"{name}.jsonl", steps=steps, lane=lane)
    out = []
    try:
        for step in range(1, steps + 1):
            if step > 1:
                gen.publish(model, step - 1)
            batch = made.produce(step)
            out.append((sampled(batch), batch.metrics))
    finally:
        gen.close()
    return out, logical(tmp_path / f"{name}.jsonl"), [json.loads(x) for x in
                                                      (tmp_path / f"{name}.jsonl").read_text().splitlines()]


def test_overlapped_rounds_draw_what_the_rounds_without_overlap_draw(fakes, tiny, tmp_path):
    """Three version-sensitive fake servers with a tail of row lengths: with overlap, servers move to step s+1's
    version during step s and draw its fresh rows' first rounds there; every step's rows, log-probs, per-token
    versions and rewards, and the journal's rounds, equal the run without overlap; rows were drawn ahead, and rows
    drawn past a step's end were cut back."""
    fleet = [fakes(versioned=True, tail=4, slow_s=0.02) for _ in range(3)]
    urls = [f.url for f in fleet]
    plain, plain_journal, _ = run_steps(urls, tiny, tmp_path, "plain", overlap=False)
    over, over_journal, raw = run_steps(urls, tiny, tmp_path, "over", overlap=True)
    assert [s for s, _ in over] == [s for s, _ in plain]
    assert over_journal == plain_journal and len(plain_journal) >= 8
    assert sum(line["drawn_ahead"] for line in raw) > 0  # the next step's rows were drawn on servers moved ahead
    assert sum(m["rollout/overlap_servers_lent"] for _, m in over) > 0
    versions = {v for s, _ in over for row in s[3] for v in row if v >= 0}
    assert versions >= {0, 1, 2}  # rows of several versions, each as the plain run drew it
    assert {k: v for k, v in over[-1][1].items()
            if not k.startswith("rollout/overlap")}.keys() == over[-1][1].keys() - {
        "rollout/overlap_servers_lent", "rollout/overlap_tokens_dropped"}


def test_a_lost_server_of_the_current_version_brings_the_fleet_back(fakes, tiny, tmp_path):
    """Server a holds version 1 (the current), b was moved to 2 ahead; a is lost: a row of version 1 finds no
    server (NoServerAtVersion), reclaim() reloads version 1 on b from the folder the publisher kept, and b draws
    it as a would have."""
    model, tok = tiny
    a, b = fakes(versioned=True), fakes(versioned=True)
    gen = build([a.url, b.url], model, tok, tmp_path)
    gen.publish(model, 1)
    want = gen.generate_ids([[1, 40]], max_new_tokens=4, seeds=[11]).ids
    [member] = gen.client.reserve(1, 1)
    assert member.url == b.url and member.version is None
    gen.move(model, 2, [member])
    assert member.version == 2 and b.version == "2"
    a.close()
    gen.client.lose(gen.client.member(a.url), NoServerAtVersion("closed"))
    with pytest.raises(NoServerAtVersion, match="no live rollout server holds weight version 1"):
        gen.generate_ids([[1, 40]], max_new_tokens=4, seeds=[11])
    gen.reclaim()
    assert gen.generate_ids([[1, 40]], max_new_tokens=4, seeds=[11]).ids == want
    reloads = [body["kwargs"]["weights_path"] for path, body in b.requests if path == "/collective_rpc"]
    assert reloads[-1].endswith("versions/v000001") and reloads[-2].endswith("model")
    gen.close()


def test_overlap_needs_rounds_in_pipeline_mode_and_the_file_publisher():
    from tests.test_partial_stages import refusal

    server = ["rollout=server", "rollout.server.urls=[http://127.0.0.1:9]", "rollout.server.overlap_steps=true"]
    rounds = ["rollout.partial=true", "rollout.correction=tis", "rollout.segment_tokens=4"]
    assert "set rollout.partial=true rollout.segment_tokens=16 rollout.max_staleness=1" in refusal(*server)
    assert "rollout.max_staleness=1" in refusal(*server, *rounds)
    assert refusal(*server, *rounds, "rollout.max_staleness=1") is None
    assert "needs the file publisher" in refusal(*server, *rounds, "rollout.max_staleness=1",
                                                 "rollout.server.publisher=lora", "model.lora.enabled=true")
    assert "algorithm.replay.enabled=true" in (refusal(*server, *rounds, "rollout.max_staleness=1",
                                                       "algorithm.replay.enabled=true")
                                  or "")


def test_a_pipeline_run_with_overlap_ends_with_the_same_weights_and_resumes_exactly(fakes, tmp_path, monkeypatch):
    """`rlx train` in pipeline mode (max_staleness 1) with rounds on two version-sensitive fake servers: with
    rollout.server.overlap_steps the metrics (but timings and server counts), the journal's rounds and the final
    weights equal the run without, bit for bit; so does a run with overlap stopped after its step-2 checkpoint
    (the groups drawn ahead for step 4 saved as drawn) and resumed."""
    from safetensors.torch import load_file

    from rlx.models.loading import load_causal_lm
    from tests.test_seed_wiring import Stopped, stop_after, train

    fleet = [fakes(versioned=True, tail=5, slow_s=0.02) for _ in range(2)]
    # the overlong penalty: rewards that differ within a group by the rows' lengths (the weights move)
    base = ["rollout=server", f"rollout.server.urls=[{fleet[0].url},{fleet[1].url}]", "rollout.partial=true",
            "rollout.correction=tis", "rollout.partial_oversample=2", "rollout.segment_tokens=2",
            "rollout.max_new_tokens=12", "rollout.max_staleness=1", "rollout.server.invariance_probe_rows=0",
            "algorithm.overlong_buffer=10", "save.final=true", "checkpoint.every=2"]
    strip = lambda row: {k: v for k, v in row.items() if k != "time" and not k.startswith(  # noqa: E731
        ("perf/", "rollout/serv", "rollout/overlap", "rollout/policy_version"))}
    plain = train(tmp_path, *base, f"rollout.server.work_dir={tmp_path / 'wa'}", steps=5, run_dir=tmp_path / "a")
    over = train(tmp_path, *base, f"rollout.server.work_dir={tmp_path / 'wb'}", "rollout.server.overlap_steps=true",
                 steps=5, run_dir=tmp_path / "b")
    assert [strip(r) for r in over] == [strip(r) for r in plain]
    assert logical(tmp_path / "b" / "rounds.jsonl") == logical(tmp_path / "a" / "rounds.jsonl")
    ahead = [json.loads(x)["drawn_ahead"] for x in (tmp_path / "b" / "rounds.jsonl").read_text().splitlines()]
    assert sum(ahead) + sum(r["rollout/overlap_tokens_dropped"] for r in over) > 0  # rounds were drawn ahead
    overlap = ["rollout.server.overlap_steps=true", f"rollout.server.work_dir={tmp_path / 'wc'}"]
    with monkeypatch.context() as patch:
        stop_after(patch, 2)
        with pytest.raises(Stopped):
            train(tmp_path, *base, *overlap, steps=5, run_dir=tmp_path / "cut")
    resumed = train(tmp_path, *base, *overlap, f"resume={tmp_path / 'cut'}", steps=5, run_dir=tmp_path / "cut")
    assert [strip(r) for r in resumed] == [strip(r) for r in plain]
    assert logical(tmp_path / "cut" / "rounds.jsonl") == logical(tmp_path / "a" / "rounds.jsonl")
    want = load_file(tmp_path / "a" / "final" / "model.safetensors")
    start = load_causal_lm("builtin:tiny").state_dict()
    assert any(not torch.equal(want[k], start[k]) for k in want if k in start)  # the weights moved
    assert any(r["rollout/rounds"] > 0 for r in plain[3:])  # a step after the cut drew rounds
    for run in ("b", "cut"):
        got = load_file(tmp_path / run / "final" / "model.safetensors")
        assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want), run
