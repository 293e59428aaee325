"""Issue 32, the first hour of a new user, agents: a run that cannot play a single turn stops at start-up with
one line naming the knob (exit 2, no run directory), a budget above the model's positions is refused, and a run
whose episodes are ended by env.max_total_tokens (not by env.max_turns) warns once and logs env/budget_cut_frac.
The environment (tests/newcomer_helpers.py: Countdown) has an observation whose token length the test sets."""

from __future__ import annotations

import json
import logging

import pytest

from tests.conftest import run_rlx

AGENT = ["algorithm=agent_grpo", "model.path=builtin:tiny_agent", "data.source=none", "steps=3", "prompts_per_step=2",
         "rollout.samples_per_prompt=2", "env.eval_episodes=2", "eval.every=3", "log.samples_every=0",
         "save.plot=false", "save.final=false", "hardware.num_threads=1", "env=custom",
         "env.target=tests.newcomer_helpers.Countdown"]
CUT = "ran out of env.max_total_tokens"


@pytest.mark.parametrize("command, extra, needle", [
    ("train", ["env.kwargs={words:300}"], "the first observation of env=Countdown takes"),
    ("train", ["env.kwargs={words:2}", "env.max_total_tokens=600"],
     "env.max_total_tokens=600 is more than the 256 positions of model builtin:tiny_agent"),
    ("eval", ["env.kwargs={words:300}"], "the first observation of env=Countdown takes"),
])
def test_a_run_that_cannot_play_a_turn_stops_at_start(tmp_path, command, extra, needle):
    args = AGENT if command == "train" else [a for a in AGENT if a.startswith(("model.", "env=", "env.target"))] + \
        ["limit=2", "sampling.n=0", "plot=false", "hardware.num_threads=1"]
    result = run_rlx([command, *args, *extra], tmp_path)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: {needle}"), result.stderr[-2000:]
    assert "env.max_total_tokens" in lines[0]
    outputs = tmp_path / "outputs" / command
    assert not outputs.is_dir() or not list(outputs.iterdir())  # rejected at start: no run directory left


def test_budget_cuts_warn_once(tmp_path):
    """30 words of observation per turn: after one turn the 240-token budget has no room for another, so every
    episode is cut by the budget: warned once, env/budget_cut_frac 1.0 every step, and the run goes on."""
    result = run_rlx(["train", *AGENT, "env.kwargs={words:30,turns:8}"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert output.count(CUT) == 1 and "step 1: 4 of 4 episodes" in output
    (run,) = (tmp_path / "outputs" / "train").iterdir()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["env/budget_cut_frac"] for r in rows if "env/budget_cut_frac" in r] == [1.0, 1.0, 1.0]


def test_max_turns_cuts_do_not_warn(tmp_path):
    """2 words per observation and env.max_turns=2: the turn limit ends every episode (truncated), not the budget:
    no warning, env/budget_cut_frac 0."""
    result = run_rlx(["train", *AGENT, "env.kwargs={words:2,turns:8}", "env.max_turns=2"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert CUT not in result.stdout + result.stderr
    (run,) = (tmp_path / "outputs" / "train").iterdir()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["env/budget_cut_frac"] for r in rows if "env/budget_cut_frac" in r] == [0.0, 0.0, 0.0]
    assert all(r["env/truncated_frac"] == 1.0 for r in rows if "env/truncated_frac" in r)  # max_turns cut them


def test_first_observation_and_budget_rules(caplog):
    """Hand numbers: first prompts of 250 and 260 tokens cannot start under a 240-token budget; one of 230 leaves
    10 tokens for a first turn of max_new_tokens 16 (a warning); one of 100 is fine. The context rule refuses 600
    over 256 positions and accepts 256."""
    from rlx.errors import UserError
    from rlx.rollout.budgets import check_context_budget, check_first_observation

    with pytest.raises(UserError, match="takes 250 tokens"):
        check_first_observation([260, 250], 240, 16, "Countdown", 256)
    with caplog.at_level(logging.WARNING, logger="rlx"):
        check_first_observation([100], 240, 16, "Countdown", 256)
        assert not caplog.records
        check_first_observation([230, 100], 240, 16, "Countdown", 256)
    assert "the first turn gets 10 of its env.max_new_tokens=16" in caplog.text
    with pytest.raises(UserError, match="set env.max_total_tokens=256 or less"):
        check_context_budget(600, 256, "builtin:tiny_agent")
    check_context_budget(256, 256, "builtin:tiny_agent")
    check_context_budget(10_000, None, "a model without max_position_embeddings")


def test_budget_watch_fires_once_above_half():
    """More than half of a step's episodes cut (3 of 4): one warning; exactly half (2 of 4) is not "most"."""
    from types import SimpleNamespace

    from rlx.rollout.budgets import BudgetWatch, budget_cut_frac

    def episodes(cut, total):
        return [SimpleNamespace(budget_cut=i < cut) for i in range(total)]

    assert budget_cut_frac(episodes(3, 4)) == 0.75
    watch = BudgetWatch(240)
    assert watch.observe(1, episodes(2, 4)) is None
    assert "step 2: 3 of 4 episodes ran out of env.max_total_tokens=240" in watch.observe(2, episodes(3, 4))
    assert watch.observe(3, episodes(4, 4)) is None  # said once
