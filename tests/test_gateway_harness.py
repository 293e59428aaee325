"""env=harness end to end: the harness contract (rlx/gateway/harness.py), sessions -> Episodes -> training rows
(episodes.py), the real `openai` client against the gateway on the tiny agent model, the direction of learning
through the agent loop, and bad input (a harness returning a string, NaN, nothing, raising, hanging)."""

import asyncio
import json
import math
import time

import openai  # noqa: F401 (imported once here, not inside the first timed harness)
import pytest
import torch

from rlx.engines.records import Rollout
from rlx.errors import UserError
from rlx.gateway.chat import ChatRenderer, normalize_messages
from rlx.gateway.episodes import session_episode
from rlx.gateway.harness import (
    HarnessError,
    HarnessSettings,
    Outcome,
    load_harness,
    play_harness,
    read_result,
)
from rlx.gateway.server import GatewaySettings
from rlx.gateway.sessions import TURN_STRIDE, Limits, Session
from rlx.rollout.episodes import training_rows
from tests.conftest import run_rlx
from tests.gateway_fixtures import ScriptedGenerator, encode, tiny_tokenizer

EOS = 2


def _chat(base_url, api_key, text="hi"):
    from openai import OpenAI

    with OpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        return client.chat.completions.create(model="m",
                                              messages=[{"role": "user", "content": text}]).choices[0].message


def flaky(task, base_url, api_key):
    """One harness, one behaviour per task: 0 plays properly, the others fail in the ways the issue lists."""
    if task == 3:
        return 1.0  # never calls the model
    _chat(base_url, api_key)
    if task == 1:
        return "1.0"
    if task == 2:
        return float("nan")
    if task == 4:
        raise KeyError("the harness's own bug")
    if task == 5:
        time.sleep(30)  # past env.timeout_s: abandoned
    if task == 6:
        return {"reward": 1.0, "rewards": [0.5]}  # disagreeing
    return {"reward": 1.0, "success": 1.0}


async def async_harness(task, base_url, api_key):
    from openai import AsyncOpenAI

    async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        if task == 1:
            await asyncio.sleep(30)
    return 0.5


def returns_string(task, base_url, api_key):
    _chat(base_url, api_key)
    return "great"


def _settings(**gateway):
    return HarnessSettings(concurrency=8, timeout_s=3.0, gateway=GatewaySettings(max_new_tokens=8, max_total_tokens=240,
                                                                                 **gateway))


def test_a_failing_harness_gives_marked_episodes_and_the_batch_goes_on():
    gen = ScriptedGenerator(lambda c, s: "L")
    start = time.monotonic()
    episodes = play_harness(gen, tiny_tokenizer(), flaky, list(range(7)), list(range(7)), list(range(7)), _settings())
    assert time.monotonic() - start < 25  # the hanging harness is abandoned at its timeout
    good, as_string, nan, silent, raised, hung, disagree = episodes
    assert good.error is None and good.step_rewards == [1.0] and good.success == 1.0 and not good.truncated
    assert good.ids == encode("L") + [EOS] and good.loss_mask == [1, 1]
    for e, needle in [(as_string, "'1.0' (str)"), (nan, "nan"), (silent, "never called the model"),
                      (raised, "KeyError"), (hung, "timeout"), (disagree, "sum to 0.5")]:
        assert e.truncated and e.error is not None and needle in e.error, (needle, e.error)
        assert sum(e.step_rewards) == 0.0 and e.success == 0.0
    from rlx.evaluation.agents import episode_metrics
    from rlx.gateway.episodes import harness_metrics

    assert episode_metrics(episodes, "env")["env/errors"] == 6
    assert harness_metrics(episodes, "env")["env/timeouts"] == 1


def test_an_async_harness_runs_and_is_cancelled_at_its_timeout():
    gen = ScriptedGenerator(lambda c, s: "L")
    done, hung = play_harness(gen, tiny_tokenizer(), async_harness, [0, 1], [0, 1], [0, 1], _settings())
    assert done.error is None and done.step_rewards == [0.5]
    assert hung.error.startswith("timeout") and hung.truncated


def test_every_episode_failing_stops_with_one_line():
    with pytest.raises(HarnessError, match="every one of the 2 harness episodes failed; the first: bad return value"):
        play_harness(ScriptedGenerator(lambda c, s: "L"), tiny_tokenizer(), returns_string, [0, 1], [0, 1], [0, 1],
                     _settings())


def test_the_harness_contract_is_checked_with_one_line():
    assert issubclass(HarnessError, UserError)  # printed as `error: ...`, exit code 2
    with pytest.raises(HarnessError, match="cannot import nowhere_xyz"):
        load_harness("nowhere_xyz.run")
    with pytest.raises(HarnessError, match="must accept \\(task, base_url, api_key\\)"):
        load_harness(lambda task: 1.0)
    with pytest.raises(HarnessError, match="must name a function"):
        load_harness(None)


@pytest.mark.parametrize("result,calls,expected", [
    (0.5, 1, Outcome(reward=0.5)),
    ({"rewards": [0.0, 1.0], "anchors": [[0, 1], "b"], "valid": [True, False]}, 2,
     Outcome(reward=1.0, rewards=[0.0, 1.0], anchors=[(0, 1), "b"], valid=[True, False])),
    ({"reward": 2, "success": True}, 1, Outcome(reward=2.0, success=1.0)),
])
def test_read_result_accepts_the_documented_forms(result, calls, expected):
    assert read_result(result, calls) == expected


@pytest.mark.parametrize("result,needle", [
    ("1", "not a finite number"), (True, "not a finite number"), (None, "not a finite number"),
    (math.inf, "not a finite number"), ({"rewrd": 1}, "unknown keys ['rewrd']"), ({"success": 1}, "without 'reward'"),
    ({"rewards": [1.0]}, "one reward per model call"), ({"reward": 1, "anchors": [1]}, "one per model call"),
    ({"reward": 1, "anchors": [{1}, {2}]}, "not hashable"), ({"reward": 1, "truncated": "yes"}, "not true/false"),
])
def test_read_result_names_what_is_wrong(result, needle):
    with pytest.raises(ValueError, match=None) as info:
        read_result(result, 2)
    assert needle in str(info.value)


def test_forked_rows_train_each_sampled_token_once_with_its_own_steps_advantage():
    """Session: call 0 on [u1] samples a0; call 1 on [u1, a0, u2] extends row 0; call 2 on [u1, a0, u2'] forks row
    1 (copies prompt + a0 as context). The Episode is row 1 (the last call's); row 0 is its fork. Steps 0, 1, 2
    get advantages 10, 20, 30; another episode, first in the batch (one step), gets 40: flat step advantages
    [40, 10, 20, 30]. Expected per sampled token: that episode 40; row 1 holds call 2 (30) and a0 as context (0);
    row 0, the fork row after both episodes, holds calls 0 (10) and 1 (20)."""
    from rlx.loops.credit import token_advantages

    renderer, session = ChatRenderer(tiny_tokenizer()), Session("s", 1, Limits(8, 8, 240), EOS)

    def call(messages, text):
        pending = session.prepare_chat(normalize_messages(messages), None, renderer)
        ids = encode(text) + [EOS]
        session.record(pending, ids, [-1.0] * len(ids), True, text,
                       normalize_messages([{"role": "assistant", "content": text}])[0], "stop", 0)

    u1, a0 = {"role": "user", "content": "u1"}, {"role": "assistant", "content": "L"}
    call([u1], "L")
    call([u1, a0, {"role": "user", "content": "u2"}], "R")
    call([u1, a0, {"role": "user", "content": "u2 edited"}], "LL")
    episode = session_episode(session, Outcome(reward=1.0))
    other_session = Session("t", 2, Limits(8, 8, 240), EOS)
    pending = other_session.prepare_chat(normalize_messages([u1]), None, renderer)
    other_session.record(pending, encode("R") + [EOS], None, True, "R", normalize_messages([a0])[0], "stop", 0)
    other = session_episode(other_session, Outcome(reward=0.0))
    assert len(episode.forks) == 1 and episode.step_rewards == [0.0, 0.0, 1.0] and episode.actions == ["L", "R", "LL"]
    rows, owner = training_rows([other, episode])
    assert owner.tolist() == [0, 1, 1]
    batch = Rollout.from_episodes(rows, 0)
    step_episode = torch.tensor([0, 1, 1, 1])
    adv = token_advantages(torch.tensor([40.0, 10.0, 20.0, 30.0]), step_episode, batch.step_index, owner)
    sampled = batch.loss_mask.bool()
    assert adv[0][sampled[0]].tolist() == [40.0, 40.0]
    assert adv[1][sampled[1]].tolist() == [30.0] * len(encode("LL") + [EOS])
    assert adv[2][sampled[2]].tolist() == [10.0, 10.0, 20.0, 20.0]
    assert int(batch.loss_mask.sum()) == 2 + 2 + 3 + 2  # every sampled token once
    assert (adv[~sampled] == 0).all()


def test_the_gateway_plays_exactly_the_tokens_of_the_environment_loop():
    """The corridor harness (examples/corridor_harness.py, the real openai client) against the gateway on the
    tiny agent model plays token for token what env=corridor plays (same seeds: the session's call t samples
    with seed s * TURN_STRIDE + t, as rollout/env.py's turn t)."""
    from rlx.config.overrides import check_overrides
    from rlx.engines.generator import HFGenerator
    from rlx.envs import env_factory
    from rlx.evaluation.agents import player_for
    from rlx.models.loading import load_causal_lm
    from rlx.rollout.env import TurnDecoding

    torch.set_num_threads(1)
    generator = HFGenerator(load_causal_lm("builtin:tiny_agent"), tiny_tokenizer(), logprobs="sampler")
    seeds, sample_seeds = [11, 11, 12, 13], [5, 6, 7, 8]
    env_cfg = check_overrides(["env=corridor"]).env
    harness_cfg = check_overrides(["env=harness", "env.target=examples.corridor_harness.run",
                                   "env.max_new_tokens=3"]).env
    expected = player_for(env_cfg)[0](generator, tiny_tokenizer(), env_factory("corridor"), env_cfg, seeds,
                                      sample_seeds,
                                       TurnDecoding(greedy=False))
    got = player_for(harness_cfg)[0](generator, tiny_tokenizer(), None, harness_cfg, seeds, sample_seeds,
                                     TurnDecoding(greedy=False))
    assert TURN_STRIDE == 1000003
    for e, g in zip(expected, got):
        assert g.error is None and not g.forks
        assert (g.prompt_ids, g.ids, g.loss_mask, g.turn_spans) == (e.prompt_ids, e.ids, e.loss_mask, e.turn_spans)
        assert (g.step_rewards, g.anchors, g.valid, g.actions, g.truncated) == (e.step_rewards, e.anchors, e.valid,
                                                                                 e.actions, e.truncated)
        assert g.logprobs == pytest.approx(e.logprobs, abs=1e-5)


# ------------------------------------------------------------------ the direction of learning


def judged(task, base_url, api_key):
    """Pays 1 when the reply holds the LIKELY completion's text (the signal is built by the generator below)."""
    from tests.loop_fixtures import LIKELY

    return float(LIKELY in (_chat(base_url, api_key, "Say the answer.").content or ""))


class GroupAlternating:
    """Stands in for the policy's generator: sample seed i of a step's episodes answers LIKELY when i is even,
    UNLIKELY when odd, whatever order the gateway batches them in (so every group of 4 holds two of each);
    log-probs are the policy's own (one plain forward pass)."""

    def __init__(self, tokenizer, steps, episodes, seed=0):
        from rlx.engines.sampling import sample_seed

        self.tokenizer, self.samples = tokenizer, []
        self.index = {sample_seed(seed, step, i) * TURN_STRIDE: i for step in range(1, steps + 1)
                      for i in range(episodes)}

    version = 0

    def publish(self, model, version: int) -> None:
        self.version = version

    def sleep(self) -> None:
        pass

    def step_metrics(self) -> dict:
        return {}

    def close(self) -> None:
        pass

    def __call__(self, rollout, model, tokenizer, seed, **__):
        self.model = model
        return self

    def generate_ids(self, prompts, *, seeds, **_):
        from rlx.engines.records import Generation
        from tests.loop_fixtures import LIKELY, UNLIKELY, completion_tokens, plain_logprobs

        rows = []
        for ids, seed in zip(prompts, seeds):
            text = LIKELY if self.index.get(seed, 1) % 2 == 0 else UNLIKELY
            rows.append((list(ids), completion_tokens(self.tokenizer, text), text))
        self.samples += rows
        return Generation([c for _, c, _ in rows], [plain_logprobs(self.model, p, c).tolist() for p, c, _ in rows],
                          [True] * len(rows))


def test_the_agent_loop_raises_the_action_a_harness_pays_for(tmp_path, monkeypatch):
    import rlx.build as build
    from rlx.loops import policy_gradient
    from tests.loop_fixtures import LIKELY, components, loop_config, plain_logprobs, run_loop, tiny_policy

    torch.set_num_threads(1)
    model, tokenizer = tiny_policy()
    sampler = GroupAlternating(tokenizer, steps=2, episodes=8)
    monkeypatch.setattr(build, "build_generator", sampler)
    cfg = loop_config("algorithm=agent_grpo", "env=harness", "env.target=tests.test_gateway_harness.judged",
                      "env.eval_episodes=1", "prompts_per_step=2", "rollout.samples_per_prompt=4", "micro_batch_size=4",
                      "optim.lr=1e-4", "steps=2")
    start, _ = tiny_policy()
    run_loop(policy_gradient.train_policy_gradient, cfg, components(tmp_path, model, tokenizer))
    seen = {(tuple(p), tuple(c)): text for p, c, text in sampler.samples}
    assert set(seen.values()) == {LIKELY, "I do not know"} and len(sampler.samples) == 16
    for (prompt, completion), text in seen.items():
        change = (plain_logprobs(model, list(prompt), list(completion)).sum()
                  - plain_logprobs(start, list(prompt), list(completion)).sum()).item()
        assert (change > 0.05) if text == LIKELY else (change < -0.05), f"{text}: {change:+.3f}"


# ------------------------------------------------------------------ the command line


@pytest.mark.parametrize("args,needle", [
    (["env.target=nowhere_xyz.run"], "cannot import nowhere_xyz"),
    (["env.target=tests.test_gateway_harness.judged", "env.tasks=/no/such/file.jsonl"], "does not exist"),
    (["env.target=tests.test_gateway_harness.judged", "env.host=0.0.0.0"], "not a loopback address"),
    pytest.param(["env.target=tests.test_gateway_harness.returns_string", "steps=1"],
                 "every one of the 4 harness episodes failed", marks=pytest.mark.long),  # ~25 s: a model and a step
])
def test_bad_harness_input_is_one_error_line(tmp_path, args, needle):
    result = run_rlx(["train", "algorithm=agent_grpo", "env=harness", "data.source=none", "prompts_per_step=2",
                      "rollout.samples_per_prompt=2", "eval.at_start=false", "hardware.num_threads=1", *args], tmp_path,
                     timeout=300)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and lines[-1].startswith("error: ") and needle in lines[-1], result.stderr[-2000:]
    if "steps=1" not in args:  # refused by the config checks, before a model is loaded (a run writes config.yaml then)
        assert not list((tmp_path / "outputs").glob("train/*/config.yaml"))


# ------------------------------------------------------------------ the examples learn (slow)


@pytest.mark.long
@pytest.mark.parametrize("recipe,overrides,floor", [
    ("agent_grpo_corridor_tiny",
     ["env.target=examples.corridor_harness.run", "env.max_new_tokens=3", "env.max_turns=8"], 0.9),
    ("agent_grpo_tool_tiny", ["env.target=examples.tool_harness.run", "env.tool_parser=tags",
                              "env.chat_template=examples/tiny_tools.jinja", "env.max_new_tokens=24",
                              "env.max_turns=3"], 0.45),
])
def test_the_examples_learn(tmp_path, recipe, overrides, floor):
    """The recipes' full budget with env=harness (2-5 min each on one core): held-out success from the warm start
    (corridor 0.67, tool use 0.23) to above the floor (docs/agents/harness.md: 3 seeds each)."""
    from tests.conftest import REPO, only_run_dir

    overrides = [o.replace("examples/", f"{REPO}/examples/") for o in overrides]
    result = run_rlx(["train", recipe, "env=harness", *overrides, "hardware.num_threads=1", "save.final=false"],
                     tmp_path, timeout=1200)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (only_run_dir(tmp_path) / "metrics.jsonl").read_text().splitlines()]
    evals = [r["eval/success"] for r in rows if "eval/success" in r]
    assert evals[-1] >= floor and evals[-1] > evals[0] + 0.1, evals


def test_every_environment_name_has_a_schema_and_harness_knobs_are_named_as_such(capsys):
    from rlx.config.groups import ENVS, Env, HarnessEnv
    from rlx.config.overrides import check_overrides
    from rlx.config.schema import check_config
    from rlx.envs import ENVIRONMENTS

    assert set(ENVS) == {*ENVIRONMENTS, "custom", "harness"} and ENVS["harness"] is HarnessEnv and ENVS["grid"] is Env
    with pytest.raises(SystemExit):
        check_overrides(["env=grid", "env.concurrency=4"])
    assert "env.concurrency is a harness knob; use env=harness" in capsys.readouterr().err
    with pytest.raises(UserError, match="env.max_wait_ms=-1 is not valid"):
        check_config(check_overrides(["env=harness", "env.max_wait_ms=-1"]))
    with pytest.raises(UserError, match="unknown env.tool_parser 'qwen'"):
        check_config(check_overrides(["env=harness", "env.tool_parser=qwen"]))


def test_gateway_command_serves_the_typed_settings_and_stops_on_sigterm(tmp_path):
    """`rlx gateway`: the composed config becomes typed settings (rlx.config.settings.checked_settings), the policy of
    model.path is served at a port the OS picks with env.max_new_tokens and rollout.temperature from them, a chat
    call through the real client answers, SIGTERM stops it (exit 0) and --record writes the session; a bad knob
    stops it before anything loads, one line, exit 2."""
    import os
    import re
    import signal
    import subprocess
    import sys

    bad = subprocess.run([sys.executable, "-m", "rlx", "gateway", "model.path=builtin:tiny_agent",
                          "rollout.temperature=-1"],
                         capture_output=True, text=True, timeout=120, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert bad.returncode == 2 and "rollout.temperature=-1 is not valid" in bad.stderr, bad.stderr[-500:]
    record = tmp_path / "sessions.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "rlx", "gateway", "model.path=builtin:tiny_agent",
                             "env.max_new_tokens=5",
                             "rollout.temperature=0.5", "hardware.num_threads=1", "--record", str(record)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, HF_HUB_OFFLINE="1"))
    try:
        lines = [proc.stdout.readline() for _ in range(3)]
        assert "temperature 0.5" in lines[0] and "at most 5 tokens a call" in lines[0], lines
        session_url = re.search(r"record a session: (\S+)/sessions/NAME/v1", lines[1]).group(1) + "/sessions/s1/v1"
        api_key = re.search(r"api_key:\s+(\S+)", lines[2]).group(1)
        assert isinstance(_chat(session_url, api_key).content, str)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-800:]
    rows = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["calls"] == 1 and 1 <= len(rows[0]["rows"][0]["ids"]) <= 5
