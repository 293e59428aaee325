"""An environment that fails every episode (issue 31): after env.stop_after_failed_steps training steps in a row
with every episode failed, the run stops with one line quoting the first error, the environment's class and
how many episodes failed that way (exit code 1), instead of training on empty rows to the end."""

import json
import re
from types import SimpleNamespace

import pytest

from rlx.errors import EpisodesFailed
from rlx.rollout.failures import EpisodeFailureWatch, error_kind
from tests.conftest import only_run_dir, run_rlx


class NoReset:
    """A broken environment: every reset raises (the issue's reproduction returned None from reset, which since
    issue 36 stops the run at once as a mistake in the environment's code: tests/test_bad_input.py)."""

    def reset(self, *, seed=None, options=None):
        raise RuntimeError("the game server is down")

    def step(self, action):
        return "done", 0.0, True, False, {}


class NoResetWithExpert(NoReset):
    """The same, with the expert moves algorithm=agent_sft imitates."""

    def expert_action(self):
        return "R"

    def random_action(self, rng):
        return "L"


def _episodes(*errors):
    return [SimpleNamespace(error=e, loss_mask=[] if e else [1]) for e in errors]  # a good episode sampled a token


def test_the_run_stops_at_the_third_step_in_a_row_with_every_episode_failed():
    """Steps 1-2 all fail, step 3 has one good episode (the streak restarts), steps 4-6 all fail: stop at 6.
    The message quotes the streak's first error (step 4) and counts the episodes of steps 4-6 with its kind:
    steps 4 and 5 have 2 `reset: TypeError` each, step 6 one of them and one `step: KeyError` -> 5 of 6."""
    watch = EpisodeFailureWatch(3, factory=NoReset)
    bad = "reset: TypeError: cannot unpack non-iterable NoneType object"
    for step in (1, 2):
        watch.observe(step, _episodes(bad, bad))
    watch.observe(3, _episodes(bad, None))
    watch.observe(4, _episodes(bad, bad))
    watch.observe(5, _episodes(bad, bad))
    with pytest.raises(EpisodesFailed) as info:
        watch.observe(6, _episodes(bad, "step: KeyError: 'x'"))
    message = str(info.value)
    assert message.startswith("every episode of steps 4-6 failed (6 episodes; env.stop_after_failed_steps=3): the "
                              f"first, at step 4, in tests.test_env_failures.NoReset: {bad}; 5 of 6 episodes failed "
                              "with reset: TypeError."), message
    assert "\n" not in message and "env.stop_after_failed_steps=0" in message


def test_zero_turns_the_check_off_and_an_empty_step_is_not_a_failure():
    off = EpisodeFailureWatch(0, factory=NoReset)
    for step in range(1, 10):
        off.observe(step, _episodes("reset: ValueError: x"))
    on = EpisodeFailureWatch(1, factory=NoReset)
    on.observe(1, [])  # no episodes at all (a process with no share): nothing to judge
    assert error_kind("step: ValueError: step() returned reward nan") == "step: ValueError"


ARGS = ["data.source=none", "model.path=builtin:tiny_agent", "prompts_per_step=2", "rollout.samples_per_prompt=4",
        "env.eval_episodes=4", "hardware.num_threads=1", "log.progress=false", "steps=8"]


def _one_error_line(result, code):
    assert result.returncode == code, result.stderr[-3000:]
    assert "Traceback" not in result.stderr + result.stdout, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr[-3000:]
    return lines[0]


def test_a_custom_environment_whose_reset_returns_none_stops_the_run(tmp_path):
    """As a user types it: 2 tasks x 4 episodes per step, all failing; checkpoint.every=2 writes step 2's."""
    result = run_rlx(["train", "algorithm=agent_grpo", "env=custom", "env.target=tests.test_env_failures.NoReset",
                      "checkpoint.every=2", *ARGS], tmp_path, timeout=300)
    line = _one_error_line(result, 1)
    run = only_run_dir(tmp_path)
    assert line.startswith("error: every episode of steps 1-3 failed (24 episodes; env.stop_after_failed_steps=3): the "
                           "first, at step 1, in tests.test_env_failures.NoReset: reset: RuntimeError: the game server "
                           "is down; "), line
    assert "24 of 24 episodes failed with reset: RuntimeError" in line, line
    assert line.endswith(f"resume continues from step 2 ({run}/checkpoints/step_000002); then run: rlx train "
                         f"resume={run}"), line
    rows = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["env/errors"]) for r in rows if "env/errors" in r] == [(1, 8), (2, 8)]  # kept


def test_agent_sft_on_an_environment_without_expert_moves_is_refused_in_one_line(tmp_path):
    refused = run_rlx(["train", "algorithm=agent_sft", "env=custom", "env.target=tests.test_env_failures.NoReset",
                       *ARGS], tmp_path, timeout=300)
    assert "NoReset has no expert_action() and random_action() methods" in _one_error_line(refused, 2)


def test_agent_sft_on_a_failing_environment_stops_too(tmp_path):
    stopped = run_rlx(["train", "algorithm=agent_sft", "env=custom", "env.stop_after_failed_steps=2",
                       "env.target=tests.test_env_failures.NoResetWithExpert", *ARGS], tmp_path, timeout=300)
    line = _one_error_line(stopped, 1)
    assert re.match(r"error: every episode of steps 1-2 failed \(16 episodes; env.stop_after_failed_steps=2\): the "
                    r"first, at step 1, in tests.test_env_failures.NoResetWithExpert: reset: RuntimeError: .*; 16 of "
                    r"16 episodes failed with reset: RuntimeError\. ", line), line
    assert "no checkpoint had been written yet" in line
