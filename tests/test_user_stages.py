"""A producer stage of the user's own (issue 36 item 2): the example of docs/extending/stages.md, a module named in
`plugins=[...]` that registers `@rlx.register("stage", "truncation_watch")`, runs in `rlx train` when named in
`algorithm.stages`, and its metric reaches metrics.jsonl; the built-in stages keep their fixed order."""

import re
import textwrap

import pytest

from rlx.errors import UserError
from rlx.runtime.rundir import read_metrics
from tests.conftest import REPO, only_run_dir
from tests.test_plugins import SMALL, rlx_command

PAGE = REPO / "docs" / "extending" / "stages.md"


def page_example() -> str:
    blocks = re.findall(r"^```python\n(.*?)^```", PAGE.read_text(), flags=re.M | re.S)
    assert len(blocks) == 1
    return textwrap.dedent(blocks[0])


def test_a_user_stage_from_a_module_runs_and_its_metrics_appear(tmp_path):
    """Two steps with the page's stage: every metrics row holds mine/truncated_frac, equal to
    completions/truncated_frac (both the share of truncated completions among the samples drawn, one process,
    no dynamic sampling); max_new_tokens=4 makes some completions hit the budget."""
    (tmp_path / "my_stages.py").write_text(page_example())
    proc = rlx_command(["train", "plugins=[my_stages]", "algorithm.stages=[truncation_watch]", "steps=2",
                        "rollout.max_new_tokens=4", *SMALL], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [row for row in read_metrics(only_run_dir(tmp_path) / "metrics.jsonl")
            if "completions/truncated_frac" in row]
    assert len(rows) == 2
    for row in rows:
        assert row["mine/truncated_frac"] == pytest.approx(row["completions/truncated_frac"])
    assert any(row["mine/truncated_frac"] > 0 for row in rows)


def test_the_built_in_stages_keep_their_order_and_refuse_being_listed():
    """ORDER is today's order (noise, replay, hints, shaping, temperature; prompt sampling is the prompt source's
    `observe` now, rlx/data/sources.py); a built-in name in
    algorithm.stages is refused (it switches on by its own knobs)."""
    from rlx.rollout.stages import ORDER, STAGES, build_stages

    assert ORDER == ("verifier_noise", "replay", "hints", "shaping", "temperature_schedule")
    assert set(ORDER) <= set(STAGES)
    with pytest.raises(UserError, match="replay is a built-in stage"):
        build_stages(None, ["replay"])


def test_the_pipeline_runs_verdict_stages_first_then_records_the_first_verdict():
    """A 'verdict' stage listed last still runs before first_correct is recorded (it changes what the verifier
    reports); group stages run after, in their order; each stage's metrics and state are its own, merged."""
    from dataclasses import replace

    import torch

    from rlx.rollout.stages import ScoredDraw, Stage, StagePipeline
    from rlx.rollout.types import SameContext

    calls = []

    class Flip(Stage):
        phase = "verdict"

        def after_scoring(self, part, ctx, first_index):
            calls.append("flip")
            return replace(part, correct=~part.correct)

        def after_step(self, parts, step):
            return {"flip/n": 1}

    class Watch(Stage):
        def __init__(self, tag):
            self.tag = tag

        def after_scoring(self, part, ctx, first_index):
            calls.append(self.tag)
            assert part.first_correct.tolist() == [False, True]  # the flipped verdict, recorded once
            return replace(part, correct=torch.tensor([True, True]))

        def after_step(self, parts, step):
            return {f"{self.tag}/n": 2}

        def checkpointed(self):
            return {self.tag: object()}

    pipeline = StagePipeline([Watch("a"), Watch("b"), Flip()])
    verdicts = torch.tensor([True, False])
    drawn = ScoredDraw(None, torch.zeros(2), {}, [{}, {}], ["", ""], torch.arange(2), verdicts, verdicts, SameContext(),
                  torch.zeros(2, dtype=torch.bool), 0)
    part = pipeline.after_scoring(drawn, None, 0)
    assert calls == ["flip", "a", "b"]
    assert part.first_correct.tolist() == [False, True] and part.correct.tolist() == [True, True]
    assert pipeline.after_step([part], 1) == {"a/n": 2, "b/n": 2, "flip/n": 1}
    assert set(pipeline.checkpointed()) == {"a", "b"} and pipeline.active
    assert not StagePipeline([]).active and StagePipeline([], "all_correct").describe() == ["drop all_correct"]
