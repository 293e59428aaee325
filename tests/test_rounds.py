"""Token-budget rounds of partial rollouts (rollout.segment_tokens, rlx/rollout/rounds.py): every unfinished
row advances at most S tokens per round at the round's version, rounds repeat until prompts_per_step groups
finished, a step trains the first finished groups in draw order, each round is a line of rounds.jsonl, rows carry
per-token versions. On a scripted generator, on the tiny model with rollout=hf (reproducible, resume exact), and
on rollout=server through tests/fake_vllm.py (continuation by token prefix, seeded from the row's seed and the
prefix length)."""

from __future__ import annotations

import json

import pytest
import torch

from rlx.engines.records import Generation
from rlx.fleet.server import continuation_seed
from rlx.rollout.rounds import Rounds
from tests.fake_vllm import FakeVLLM
from tests.test_partial import EOS, Scripted, trained
from tests.test_partial import producer as partial_producer
from tests.test_seed_wiring import Stopped, stop_after, train

ROUNDS = ["rollout.partial=true", "rollout.correction=tis", "rollout.partial_oversample=2", "rollout.segment_tokens=3"]


class Segmented(Scripted):
    """Scripted rows (tests/test_partial.py) that advance at most `continuation.segment` tokens per call."""

    def generate_ids(self, prompts, *, max_new_tokens, seeds, continuation, min_new_tokens=0, **_):
        prefixes, segment = continuation.prefixes, continuation.segment
        assert continuation.stop_when is None and segment
        self.calls.append([list(p) for p in prefixes])
        new = []
        for prompt, seed, prefix in zip(prompts, seeds, prefixes):
            target = min(self.lengths[prompt[0]] + seed % 2, max_new_tokens)
            row = []
            for t in range(len(prefix), min(target, len(prefix) + segment)):
                row.append(EOS if t + 1 == target and target < max_new_tokens else t + 1)
            new.append(row)
        return Generation(new, [[-0.1 * (self.version + 1)] * len(n) for n in new],
                          [bool(n) and n[-1] == EOS for n in new])


def test_rounds_advance_rows_s_tokens_at_a_time_and_journal_each_round(tmp_path):
    """S = 3, lengths 2..9: each call advances a row at most 3 tokens; rounds go on until 2 groups finished; the
    trained groups are the first finished in draw order; rounds.jsonl has a line per round; a row carried into the
    next step at a newer version has tokens of two versions (rollout/row_version_span_max)."""
    generator = Segmented([8, 2, 9, 3, 8, 8])
    made, _ = partial_producer([8, 2, 9, 3, 8, 8], prompts_per_step=2, oversample=2.0, generator=generator,
                               rounds=Rounds(3, tmp_path / "rounds.jsonl"))
    batch = made.produce(1)
    for call in generator.calls[1:]:
        assert all(len(p) % 3 == 0 for p in call)  # every prefix a whole number of rounds
    assert [p for p, _ in trained(batch)][::2] == ["p1", "p3"]  # the short groups, in draw order
    lines = [json.loads(x) for x in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    assert len(lines) == batch.metrics["rollout/rounds"] == len(generator.calls) == 2
    assert [x["round"] for x in lines] == [0, 1] and lines[-1]["groups_completed"] >= 2
    assert all(x["tokens"] <= 3 * x["rows_advanced"] and x["version"] == 0 and x["step"] == 1 for x in lines)
    assert batch.metrics["rollout/row_version_span_max"] == 0
    generator.version = 1
    batch = made.produce(2)  # p0 and p2 began at version 0 and go on at version 1
    assert batch.metrics["rollout/row_version_span_max"] == 1
    lines = [json.loads(x) for x in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines].count(2) == batch.metrics["rollout/rounds"]


def test_round_marks_and_round_end_stops_by_hand():
    """A row from 5 to 42 tokens in rounds of 16 was 21 after round 0, 37 after round 1, 42 after round 2; a row
    that drew nothing has no round; the stop rule is asked at token steps 16, 32 and 48 only (and says stop at 32)."""
    from rlx.rollout.rounds import at_round_ends, round_marks

    assert round_marks(5, 42, 16) == [5, 21, 37, 42]
    assert round_marks(5, 37, 16) == [5, 21, 37] and round_marks(5, 5, 16) == [5]
    asked = []
    stop = at_round_ends(lambda finished: asked.append(int(finished.sum())) or len(asked) == 2, 16)
    answers = [stop(torch.tensor([t > 20, False])) for t in range(1, 49)]
    assert asked == [0, 1, 1] and [t + 1 for t, stop in enumerate(answers) if stop] == [32]


class OneCall(Segmented):
    """Segmented rows that also run a step's rounds in one call (Scripted: one token per step, stop_when after each),
    as rollout=hf does; `one_call` False: round by round."""

    def __init__(self, lengths, one_call):
        super().__init__(lengths)
        self.one_call = one_call

    def rounds_in_one_call(self, rows):
        return self.one_call

    def generate_ids(self, prompts, *, continuation, **kwargs):
        if continuation.segment:
            return super().generate_ids(prompts, continuation=continuation, **kwargs)
        return Scripted.generate_ids(self, prompts, continuation=continuation, **kwargs)


def test_rounds_in_one_call_equal_rounds_drawn_one_by_one(tmp_path):
    """S = 3, four steps, versions moving: a step's rounds drawn in one call stopped at a round's end give the batches,
    pool, journal and metrics of rounds drawn round by round, with one call per step instead of one per round."""
    runs = {}
    for one_call in (True, False):
        lengths = [8, 7, 9, 3, 8, 8, 1, 7, 5, 9, 2, 4]
        generator = OneCall(lengths, one_call)
        made, _ = partial_producer(lengths, prompts_per_step=2, oversample=2.0, generator=generator,
                                   rounds=Rounds(3, tmp_path / f"{one_call}.jsonl"))
        batches = []
        for step in range(1, 5):
            generator.version = step - 1
            batch = made.produce(step)
            batches.append((trained(batch), batch.rollout.token_versions.tolist(), batch.metrics))
        runs[one_call] = (batches, made.state_dict()["pool"], (tmp_path / f"{one_call}.jsonl").read_text(),
                          len(generator.calls))
    assert runs[True][:3] == runs[False][:3]
    assert runs[True][3] <= 4 < runs[False][3]
    assert max(json.loads(x)["round"] for x in runs[True][2].splitlines()) >= 2


def test_rounds_of_one_token_on_the_tiny_model_are_partial_rollouts(tmp_path):
    """rollout=hf: rounds of 1 token stop where partial rollouts without rounds stop (after the token step in which
    enough groups finished), drawn in one call: the same rows, so the same metrics but for rollout/rounds."""
    strip = lambda row: {k: v for k, v in row.items()  # noqa: E731
                         if k not in ("time", "rollout/rounds") and not k.startswith("perf/")}
    rounds = train(tmp_path, *ROUNDS[:-1], "rollout.segment_tokens=1", steps=3, run_dir=tmp_path / "a")
    plain = train(tmp_path, *ROUNDS[:-1], steps=3, run_dir=tmp_path / "b")
    assert [strip(r) for r in rounds] == [strip(r) for r in plain]
    assert all(r["rollout/rounds"] > 1 for r in rounds[:1])


def test_rounds_with_no_extra_groups_draw_the_synchronous_rows(tmp_path):
    """rollout=hf, S = 3, rollout.partial_oversample=1: every group in flight is trained, so a step's rounds run until
    every row finished; drawn in one call, with each fresh group's prompt encoded once and its cache copied to its
    rows (as the synchronous producer does), they are the synchronous run's rows: every metric they share is equal."""
    rounds = train(tmp_path, *ROUNDS[:2], "rollout.partial_oversample=1", "rollout.segment_tokens=3", steps=3,
                   run_dir=tmp_path / "a")
    plain = train(tmp_path, *ROUNDS[1:2], steps=3, run_dir=tmp_path / "b")
    shared = [k for k in plain[0] if k != "time" and not k.startswith("perf/")]
    assert len(shared) > 20 and all(r["rollout/rounds"] >= 2 for r in rounds)
    assert [{k: r[k] for k in shared} for r in rounds] == [{k: r[k] for k in shared} for r in plain]


def test_rounds_on_the_tiny_model_are_reproducible_and_resume_exactly(tmp_path, monkeypatch):
    """rollout=hf, S = 3: two runs log the same values and write the same rounds.jsonl; a run stopped after its
    step-2 checkpoint and resumed logs what the straight run logs, and its journal drops the redone steps."""
    strip = lambda row: {k: v for k, v in row.items() if k != "time" and not k.startswith("perf/")}  # noqa: E731
    overrides = [*ROUNDS, "checkpoint.every=2"]
    first = train(tmp_path, *overrides, steps=4, run_dir=tmp_path / "a")
    second = train(tmp_path, *overrides, steps=4, run_dir=tmp_path / "b")
    assert [strip(r) for r in first] == [strip(r) for r in second]
    assert all(r["rollout/rounds"] >= 1 for r in first[:1]), first  # (a step whose groups finished before has none)
    assert any(r["rollout/row_version_span_max"] > 0 for r in first), first
    journal = (tmp_path / "a" / "rounds.jsonl").read_text()
    assert journal == (tmp_path / "b" / "rounds.jsonl").read_text()
    assert len(journal.splitlines()) == sum(r["rollout/rounds"] for r in first)
    lines = [json.loads(x) for x in journal.splitlines()]
    assert all(x["tokens"] <= 3 * x["rows_advanced"] for x in lines) and max(x["round"] for x in lines) >= 1
    with monkeypatch.context() as patch:
        stop_after(patch, 2)
        with pytest.raises(Stopped):
            train(tmp_path, *overrides, steps=4, run_dir=tmp_path / "cut")
    resumed = train(tmp_path, *overrides, f"resume={tmp_path / 'cut'}", steps=4, run_dir=tmp_path / "cut")
    assert [strip(r) for r in resumed] == [strip(r) for r in first]
    assert (tmp_path / "cut" / "rounds.jsonl").read_text() == journal


def test_server_rounds_continue_rows_by_prefix_with_derived_seeds(tmp_path):
    """rollout=server, S = 2 (fake server: a row would take 3 tokens, so every row is cut): the runs are the same
    twice; every request asks for at most 2 tokens; a continued row's request is its first request's prompt and
    the tokens so far, seeded by continuation_seed(its first seed, prefix length)."""
    fake = FakeVLLM()
    try:
        server = ["rollout=server", f"rollout.server.urls=[{fake.url}]", f"rollout.server.work_dir={tmp_path / 'w'}",
                  "rollout.max_new_tokens=6", "rollout.server.invariance_probe_rows=0", "rollout.segment_tokens=2"]
        first = train(tmp_path, *ROUNDS, *server, steps=2, run_dir=tmp_path / "a")
        sent = list(fake.completions())
        second = train(tmp_path, *ROUNDS, *server, steps=2, run_dir=tmp_path / "b")
    finally:
        fake.close()
    strip = lambda row: {k: v for k, v in row.items() if k != "time" and not k.startswith(("perf/", "rollout/serv"))}  # noqa: E731
    assert [strip(r) for r in first] == [strip(r) for r in second]
    assert first[0]["rollout/rounds"] == 3 and all(body["max_tokens"] <= 2 for body in sent)
    starts = [b for b in sent if b["max_tokens"] == 2 and not any(
        len(o["prompt"]) < len(b["prompt"]) and b["prompt"][:len(o["prompt"])] == o["prompt"] for o in sent)]
    continued = [b for b in sent if b not in starts]
    assert starts and continued
    for body in continued:
        origin = [o for o in starts if body["prompt"][:len(o["prompt"])] == o["prompt"]]
        length = len(body["prompt"]) - len(origin[0]["prompt"])
        assert body["seed"] in {continuation_seed(o["seed"], length) for o in origin}, body


def test_continuation_seed_depends_on_the_row_and_how_far_it_got():
    assert continuation_seed(5, 3) != continuation_seed(5, 4) != continuation_seed(6, 3)
    assert continuation_seed(5, 3) == continuation_seed(5, 3) and 0 <= continuation_seed(5, 3) < 2**32


def test_partial_on_a_server_needs_rounds_and_rounds_need_partial():
    from tests.test_partial_stages import refusal

    server = ["rollout=server", "rollout.partial=true", "rollout.correction=tis",
              "rollout.server.urls=[http://127.0.0.1:9]"]
    assert "set rollout.segment_tokens (e.g. 16) with rollout=server" in refusal(*server)
    assert refusal(*server, "rollout.segment_tokens=4") is None
    assert "set rollout.partial=true" in refusal("rollout.segment_tokens=4")


def test_a_carried_row_carries_each_tokens_version_in_the_record():
    """Rollout.token_versions: a row begun at version 0 and finished at version 1 holds 0 on its first tokens and 1
    on the rest, -1 after its end; Rollout.versions keeps the row's oldest; select and cat keep them aligned; a
    record pickled without the field (an older pipeline checkpoint) gets each row's version on its tokens."""
    import pickle

    from rlx.engines.records import Rollout

    generator = Segmented([8, 2, 9, 3, 8, 8])
    made, _ = partial_producer([8, 2, 9, 3, 8, 8], prompts_per_step=2, oversample=2.0, generator=generator,
                               rounds=Rounds(3))
    made.produce(1)
    generator.version = 1
    rollout = made.produce(2).rollout
    spans = [sorted(set(v[m.bool()].tolist())) for v, m in zip(rollout.token_versions, rollout.loss_mask)]
    assert [0, 1] in spans and all(s in ([0], [1], [0, 1]) for s in spans)
    row = spans.index([0, 1])
    tokens = rollout.token_versions[row]
    assert tokens[: 3].tolist() == [0, 0, 0] and int(rollout.versions[row]) == 0
    assert (tokens[rollout.loss_mask[row] == 0] == -1).all()
    both = Rollout.cat([rollout.select(torch.tensor([row])), rollout], pad_id=EOS)
    assert torch.equal(both.token_versions[0, : tokens.shape[0]], tokens)
    state = dict(rollout.__dict__)
    del state["token_versions"]
    old = Rollout.__new__(Rollout)
    old.__setstate__(state)
    assert torch.equal(old.token_versions, torch.where(rollout.loss_mask.bool(), rollout.versions.unsqueeze(1), -1))
    assert pickle.loads(pickle.dumps(rollout)).token_versions.equal(rollout.token_versions)


def test_a_round_that_advances_no_row_stops_with_one_line():
    """A generator that answers no tokens for unfinished rows would loop forever: one resumable error instead."""
    from rlx.errors import RolloutServerError

    class Silent(Segmented):
        def generate_ids(self, prompts, **kwargs):
            return Generation([[] for _ in prompts], [[] for _ in prompts], [False] * len(prompts))

    made, _ = partial_producer([8, 2, 9, 3], prompts_per_step=2, oversample=1.0, generator=Silent([8, 2, 9, 3]),
                               rounds=Rounds(3))
    with pytest.raises(RolloutServerError, match="advanced none of 4 unfinished rows"):
        made.produce(1)


def test_strict_server_rounds_resume_bitwise(tmp_path, monkeypatch):
    """rollout.server.strict=true with rounds (S = 2) through a batch-invariant fake server: a run stopped after its
    step-2 checkpoint and resumed logs the values, writes the rounds journal (but for its information-only
    `served` field) and ends with the weights, bit for bit, of the straight run; every batch drawn was probed."""
    from safetensors.torch import load_file

    fake = FakeVLLM()
    server = ["rollout=server", f"rollout.server.urls=[{fake.url}]", f"rollout.server.work_dir={tmp_path / 'w'}",
              "rollout.max_new_tokens=6", "rollout.server.strict=true", "rollout.segment_tokens=2",
              "checkpoint.every=2", "save.final=true"]
    strip = lambda row: {k: v for k, v in row.items() if k != "time" and not k.startswith(("perf/", "rollout/serv"))}  # noqa: E731
    journal = lambda run: [{k: v for k, v in json.loads(x).items() if k != "served"}  # noqa: E731
                           for x in (run / "rounds.jsonl").read_text().splitlines()]
    try:
        straight = train(tmp_path, *ROUNDS, *server, steps=4, run_dir=tmp_path / "a")
        with monkeypatch.context() as patch:
            stop_after(patch, 2)
            with pytest.raises(Stopped):
                train(tmp_path, *ROUNDS, *server, steps=4, run_dir=tmp_path / "cut")
        resumed = train(tmp_path, *ROUNDS, *server, f"resume={tmp_path / 'cut'}", steps=4, run_dir=tmp_path / "cut")
    finally:
        fake.close()
    assert [strip(r) for r in resumed] == [strip(r) for r in straight]
    drawn = [r for r in straight if r["rollout/rounds"]]  # (a step whose groups all finished earlier draws nothing)
    assert drawn and all(r["rollout/invariance_probed"] > 0 and r["rollout/invariance_differ"] == 0 for r in drawn)
    assert journal(tmp_path / "cut") == journal(tmp_path / "a") and len(journal(tmp_path / "a")) >= 4
    want, got = (load_file(tmp_path / run / "final" / "model.safetensors") for run in ("a", "cut"))
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)


def test_the_generation_mode_is_chosen_once_when_the_producer_is_built():
    """No rounds: one call; rounds on a generator that decodes the rows as one batch: in one call; with a lane that
    draws ahead, or on another generator: round by round."""
    from rlx.rollout.rounds import ByRound, InOneCall
    from rlx.rollout.rounds import OneCall as OneCallMode

    class Lane:  # a speculative lane (rlx/engines/lane.py) that never finds anything to spare
        def lend(self, work, step, rows_due):
            pass

        def finish(self):
            pass

        def reclaim(self, error):
            return False

        def metrics(self):
            return {}

    lengths = [8, 2, 9, 3]
    modes = [type(partial_producer(lengths, generator=generator, rounds=rounds)[0].mode)
             for generator, rounds in ((Segmented(lengths), None), (OneCall(lengths, True), Rounds(3)),
                                       (OneCall(lengths, True), Rounds(3, lane=Lane())),
                                       (Segmented(lengths), Rounds(3)))]
    assert modes == [OneCallMode, InOneCall, ByRound, ByRound]
