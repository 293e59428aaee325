"""Bad input at the sources (issue 36, item 8): an environment or a harness that hands back something other than
text as an observation, and a training step with no token to train on, stop with one line (exit code 2) in every
mode: training episodes, agent SFT, `rlx eval`, the start-up probe and the harness. The checks live in one place
each: rlx/rollout/env.py `observation_text` / `checked_reset`, rlx/gateway/harness.py (the sessions' `not_text`),
rlx/rollout/failures.py (the watch every producer of episodes reports to)."""

from __future__ import annotations

import pytest

from rlx.engines.records import Episode
from rlx.errors import UserError
from rlx.gateway.harness import HarnessError, HarnessSettings, play_harness
from rlx.gateway.server import GatewaySettings
from rlx.rollout.env import EpisodeLimits, run_episodes
from rlx.rollout.failures import EpisodeFailureWatch
from tests.conftest import run_rlx
from tests.gateway_fixtures import ScriptedGenerator, tiny_tokenizer
from tests.test_env_rollout import Echo, Scripted

HERE = "tests.test_bad_input"


class NumberReset(Echo):
    """reset() hands back the board as a number, not text."""

    def reset(self, *, seed=None, options=None):
        return 7, {}


class NoneReset(Echo):
    """The issue-31 reproduction: reset returns None instead of (observation, info)."""

    def reset(self, *, seed=None, options=None):
        return None


class DictStep(Echo):
    """reset is fine; step hands back the state as a dict."""

    def step(self, action):
        return {"board": 1}, 0.0, False, False, {}


class DictStepWithExpert(DictStep):
    """The same, with the expert moves algorithm=agent_sft imitates."""

    def expert_action(self):
        return "R"

    def random_action(self, rng):
        return "L"


class GrowingObservation(Echo):
    """Its first observation is short for the first two resets (the start-up probe's, at prompts_per_step=2), then
    longer than env.max_total_tokens: every training episode ends before its first turn."""

    resets = 0

    def reset(self, *, seed=None, options=None):
        GrowingObservation.resets += 1
        return " ".join(["tick"] * (4 if GrowingObservation.resets <= 2 else 400)), {}


def _one_error_line(result, code=2) -> str:
    assert result.returncode == code, result.stderr[-3000:]
    assert "Traceback" not in result.stderr + result.stdout, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr[-3000:]
    return lines[0]


# ------------------------------------------------------------------ the function that holds the check

@pytest.fixture(scope="module")
def tokenizer():
    from rlx.models.loading import load_tokenizer

    return load_tokenizer("builtin:tiny", None, False)


@pytest.mark.parametrize("env, needle", [
    (NumberReset(), "environment tests.test_bad_input.NumberReset: reset() returned an int observation (7), not text; "
                    "reset() must return (observation, info) with the observation a str"),
    (NoneReset(), "environment tests.test_bad_input.NoneReset: reset() returned None instead of (observation, info); "
                  "return a pair (observation: str, info: dict)"),
    (DictStep(), "environment tests.test_bad_input.DictStep: step() returned a dict observation ({'board': 1}), not "
                 "text; step() must return (observation, reward, terminated, truncated, info) with the observation a "
                 "str"),
])
def test_an_observation_that_is_not_text_stops_every_episode_in_one_line(tokenizer, env, needle):
    """A good episode beside it does not hide it: the mistake is in the environment's code, not one episode's luck."""
    ids = tokenizer("R", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    with pytest.raises(UserError) as info:
        run_episodes(Scripted([ids]), tokenizer, [Echo(), env], [0, 1], [0, 1], EpisodeLimits(2, 8, 200))
    assert str(info.value).startswith(needle) and "\n" not in str(info.value), str(info.value)


def test_the_start_up_probe_stops_before_the_first_step(tokenizer):
    """rlx/rollout/budgets.py resets a few environments to measure first observations: a reset that raises is left
    to its episode, one that hands back no text stops there (train and eval, before a model generates)."""
    from rlx.rollout.budgets import first_prompt_lengths

    start = len(tokenizer("start\n", add_special_tokens=False)["input_ids"])  # the plain-text prompt of Echo
    assert first_prompt_lengths(Echo, tokenizer, [0, 1], None, False) == [start, start]
    with pytest.raises(UserError, match="NumberReset: reset\\(\\) returned an int observation"):
        first_prompt_lengths(NumberReset, tokenizer, [0, 1], None, False)


def _budget_cut():
    return Episode(prompt_ids=[1] * 300, truncated=True, budget_cut=True)


def test_a_step_with_no_token_to_train_on_stops_in_one_line():
    """2 episodes with no room for a first turn and 1 failed reset: none has a sampled token -> UserError, even
    with the failure streak turned off; one sampled token anywhere in the step (a fork row counts) lets it pass."""
    failed = Episode(prompt_ids=[], truncated=True, error="reset: RuntimeError: the game server is down\nmore")
    for patience in (3, 0):
        with pytest.raises(UserError) as info:
            EpisodeFailureWatch(patience, factory=Echo).observe(5, [_budget_cut(), failed, _budget_cut()])
        assert str(info.value) == (
            "step 5 has no token to train on: none of its 3 episodes of tests.test_env_rollout.Echo sampled a token "
            "the loss keeps (2 had no room for a first turn within env.max_total_tokens; 1 ended in an error (the "
            "first: reset: RuntimeError: the game server is down)); an update would learn nothing, so the run stops: "
            "raise env.max_total_tokens or shorten the environment's observations")
    played = Episode(prompt_ids=[1], ids=[5, 2], loss_mask=[1, 1])
    EpisodeFailureWatch(3, factory=Echo).observe(5, [_budget_cut(), played])
    forked = Episode(prompt_ids=[1], forks=[Episode(prompt_ids=[1], ids=[5], loss_mask=[1])])
    EpisodeFailureWatch(3, factory=Echo).observe(5, [_budget_cut(), forked])


def not_text_harness(task, base_url, api_key):
    """Task 0 shows the model the board as a dict, not text (its run() raises on the HTTP 400); task 1 plays."""
    from openai import OpenAI

    content = {"board": [1, 2]} if task == 0 else "hi"
    with OpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": content}])
    return 1.0


def test_a_harness_that_shows_the_model_no_text_stops_in_one_line():
    """One episode of two sends a dict: the run stops although the other played (before, only a batch in which
    every episode failed stopped it)."""
    settings = HarnessSettings(concurrency=2, timeout_s=10.0, gateway=GatewaySettings(max_new_tokens=8,
                                                                                      max_total_tokens=240))
    with pytest.raises(HarnessError) as info:
        play_harness(ScriptedGenerator(lambda c, s: "L"), tiny_tokenizer(), not_text_harness, [0, 1], [0, 1], [0, 1],
                     settings)
    assert isinstance(info.value, UserError)  # printed as `error: ...`, exit code 2
    message = str(info.value)
    assert message.startswith(f"harness env.target={HERE}.not_text_harness showed the model an observation that is not "
                              "text (session p"), message
    assert message.endswith(": messages[0]: content is a dict ({'board': [1, 2]}), not text; it must be a string or a "
                            "list of text parts); send each message's content as a str (or a list of text parts), and "
                            "a /v1/completions prompt as a str"), message
    assert "\n" not in message


# ------------------------------------------------------------------ as a user runs it: exit code 2, one line

AGENT = ["model.path=builtin:tiny_agent", "data.source=none", "prompts_per_step=2", "rollout.samples_per_prompt=2",
         "env.eval_episodes=2", "eval.at_start=false", "log.samples_every=0", "save.plot=false", "save.final=false",
         "hardware.num_threads=1", "log.progress=false", "steps=2", "env=custom"]


@pytest.mark.parametrize("command, target, needle", [
    ("train agent_grpo", "NumberReset", "environment tests.test_bad_input.NumberReset: reset() returned an int "
                                        "observation (7), not text"),
    ("train agent_grpo", "DictStep", "environment tests.test_bad_input.DictStep: step() returned a dict observation"),
    ("train agent_sft", "DictStepWithExpert", "environment tests.test_bad_input.DictStepWithExpert: step() returned a "
                                              "dict observation"),
    ("eval", "DictStep", "environment tests.test_bad_input.DictStep: step() returned a dict observation"),
    ("eval", "NoneReset", "environment tests.test_bad_input.NoneReset: reset() returned None instead of"),
])
def test_every_mode_stops_on_an_observation_that_is_not_text(tmp_path, command, target, needle):
    if command == "eval":
        args = ["eval", "model.path=builtin:tiny_agent", "env=custom", f"env.target={HERE}.{target}", "limit=2",
                "sampling.n=0", "plot=false", "hardware.num_threads=1"]
    else:
        args = ["train", f"algorithm={command.split()[1]}", *AGENT, f"env.target={HERE}.{target}"]
    line = _one_error_line(run_rlx(args, tmp_path, timeout=300))
    assert line.startswith(f"error: {needle}"), line


def test_a_training_run_whose_episodes_never_play_a_turn_stops(tmp_path):
    """The start-up probe sees two short first observations; step 1's are 400 words: no episode has room for a
    turn in env.max_total_tokens=240, so step 1 stops the run (before, it trained on nothing and exited 0)."""
    result = run_rlx(["train", "algorithm=agent_grpo", *AGENT, f"env.target={HERE}.GrowingObservation",
                      "env.max_total_tokens=240"], tmp_path, timeout=300)
    line = _one_error_line(result)
    assert line.startswith("error: step 1 has no token to train on: none of its 4 episodes of "
                           f"{HERE}.GrowingObservation sampled a token the loss keeps (4 had no room for a first turn "
                           "within env.max_total_tokens)"), line
