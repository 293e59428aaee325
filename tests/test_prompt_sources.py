"""Prompt sources (rlx/data/sources.py; docs/extending/sources.md): a curriculum of one's own is one file
(examples/shortest_first_source.py) that keeps rlx's producer (dynamic sampling here), and resumes exactly; the
source registry's names reach the config; auto picks the stream or the difficulty sampler."""

import re
from types import SimpleNamespace

import pytest
import torch

from rlx.cli.training import check_run
from rlx.config.overrides import check_overrides
from rlx.data.difficulty import DifficultySampler
from rlx.data.sources import PROMPT_SOURCES, PromptStream, prompt_source
from rlx.errors import UserError
from tests.conftest import REPO, run_rlx
from tests.test_producer_plugin import QUIET, _metrics

PLUGIN = ["plugins=[examples.shortest_first_source]", "algorithm.prompt_sampling.source=shortest_first"]


def test_a_curriculum_of_ones_own_keeps_dynamic_sampling_and_resumes_exactly(tmp_path):
    """Three steps with the example source and dynamic sampling (several draws a step: the source hands each draw the
    next shortest questions); a run stopped after step 2 and resumed gives step 3 equal in every logged value."""
    common = ["train", *PLUGIN, *QUIET, "prompts_per_step=2", "rollout.samples_per_prompt=2", "checkpoint.every=1",
              "algorithm.dynamic_sampling=true", "algorithm.max_sample_batches=2"]
    straight = run_rlx([*common, "steps=3", "name=straight"], tmp_path)
    assert straight.returncode == 0, straight.stderr[-2000:]
    assert "built: prompt source shortest_first" in straight.stderr + straight.stdout
    _, rows = _metrics(tmp_path, "straight")
    lengths = [row["curriculum/longest_question_chars"] for row in rows]
    assert lengths == sorted(lengths) and len(rows) == 3  # shortest questions first
    assert all("train/filled_groups" in row and row["train/prompts_drawn"] >= 2 for row in rows)
    cut = run_rlx([*common, "steps=2", "name=cut"], tmp_path)
    assert cut.returncode == 0, cut.stderr[-2000:]
    run, _ = _metrics(tmp_path, "cut")
    resumed = run_rlx(["train", f"resume={run}", "steps=3"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    _, again = _metrics(tmp_path, "cut")
    assert again[-1]["step"] == 3
    timing = re.compile(r"^perf/|time")
    assert {k: v for k, v in again[-1].items() if not timing.search(k)} == {
        k: v for k, v in rows[-1].items() if not timing.search(k)}


def test_the_page_shows_the_example_file():
    page = (REPO / "docs" / "extending" / "sources.md").read_text()
    (block,) = re.findall(r"^```python\n(.*?)^```", page, flags=re.M | re.S)
    assert block == (REPO / "examples" / "shortest_first_source.py").read_text()


def test_auto_is_the_stream_or_the_difficulty_sampler():
    rows = [{"question": str(i)} for i in range(4)]

    def settings(source, mode):
        knobs = SimpleNamespace(source=source, mode=mode, ema=0.5, eps=0.01, prior=0.5, retire_after=0)
        return SimpleNamespace(seed=3, algorithm=SimpleNamespace(prompt_sampling=knobs))

    name, stream = prompt_source(rows, settings("auto", "uniform"))
    assert name == "stream" and isinstance(stream, PromptStream)
    assert stream.observe(stream.take(2), [torch.ones(2, dtype=torch.bool)] * 2) == {}
    name, sampler = prompt_source(rows, settings("auto", "hard"))
    assert name == "difficulty" and isinstance(sampler, DifficultySampler) and sampler.mode == "hard"
    assert prompt_source(rows, settings("difficulty", "uniform"))[0] == "difficulty"
    assert list(PROMPT_SOURCES)[:2] == ["stream", "difficulty"]


def test_a_source_name_is_checked_and_a_mode_it_would_ignore_refused():
    with pytest.raises(UserError, match=r"unknown algorithm.prompt_sampling.source 'nope'; valid choices: auto, "
                                        r"stream, difficulty"):
        check_run(check_overrides(["algorithm.prompt_sampling.source=nope"]))
    with pytest.raises(UserError, match="algorithm.prompt_sampling.mode=hard weights the difficulty sampler's draws"):
        check_run(check_overrides(["algorithm.prompt_sampling.source=stream", "algorithm.prompt_sampling.mode=hard"]))
