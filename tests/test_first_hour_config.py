"""Issue 32, the first hour of a new user: the command-line syntax the README writes (free-form groups without
`+`, one-line errors that never suggest the refused key, every TRL name at once, recipe descriptions cut at a
sentence end, not inside a number). Each test runs the command as a user types it, from a temporary directory."""

from __future__ import annotations

import pytest
import yaml

from tests.conftest import run_rlx

AGENT = ["algorithm=agent_grpo", "model.path=builtin:tiny_agent", "data.source=none"]


def _job(result) -> dict:
    """The config `rlx train ... --cfg job` printed."""
    assert result.returncode == 0, result.stderr[-2000:]
    return yaml.safe_load(result.stdout)


def test_readme_env_kwargs_without_plus(tmp_path):
    """README, Agents: `rlx train algorithm=agent_grpo env=custom env.target=my_module.MyEnv env.kwargs={size:4}`
    (and the TextArena form 'env.kwargs={env_id:GuessTheNumber-v0}') compose as written."""
    for kwargs, expected in (("env.kwargs={size:4}", {"size": 4}),
                             ("env.kwargs={env_id:GuessTheNumber-v0}", {"env_id": "GuessTheNumber-v0"})):
        job = _job(run_rlx(["train", *AGENT, "env=custom", "env.target=my_module.MyEnv", kwargs, "--cfg", "job"],
                           tmp_path))
        assert job["env"]["kwargs"] == expected
    # one key of an env's kwargs, and a key the YAML already has: merged into the env's own kwargs
    job = _job(run_rlx(["train", *AGENT, "env=grid", "env.kwargs={size:4}", "env.kwargs.extra=1", "--cfg", "job"],
                       tmp_path))
    assert job["env"]["kwargs"]["size"] == 4 and job["env"]["kwargs"]["extra"] == 1 and "holes" in job["env"]["kwargs"]


def test_reward_components_and_task_config_without_plus(tmp_path):
    job = _job(run_rlx(["train", "reward.components.mine._target_=tests.helpers.length_reward",
                        "reward.components.mine.weight=0.5", "data=reasoning_gym", "data.task=gcd",
                        "data.task_config={max_value:100}", "--cfg", "job"], tmp_path))
    assert job["reward"]["components"]["mine"] == {"_target_": "tests.helpers.length_reward", "weight": 0.5}
    assert set(job["reward"]["components"]) == {"task", "format", "mine"}
    assert job["data"]["task_config"] == {"max_value": 100}
    # the `+` form keeps working
    job = _job(run_rlx(["train", "+reward.components.mine._target_=tests.helpers.length_reward", "--cfg", "job"],
                       tmp_path))
    assert job["reward"]["components"]["mine"]["_target_"] == "tests.helpers.length_reward"


def test_eval_env_kwargs_without_plus_plays_the_environment(tmp_path):
    """`rlx eval env=custom env.target=... 'env.kwargs={...}'` builds the environment with those kwargs: the
    Countdown environment ends after `turns` turns, so the recorded episodes have exactly 3 turns."""
    result = run_rlx(["eval", "env=custom", "env.target=tests.newcomer_helpers.Countdown", "env.kwargs={turns:3,words:2}",
                      "model.path=builtin:tiny_agent", "limit=2", "sampling.n=0", "plot=false",
                      "hardware.num_threads=1"], tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    import json

    (summary,) = (tmp_path / "outputs" / "eval").glob("*/summary.json")
    metrics = json.loads(summary.read_text())["benchmarks"]["env_Countdown"]["model"]
    assert metrics["greedy/turns"]["value"] == 3.0 and metrics["greedy/success"]["value"] == 1.0


@pytest.mark.parametrize("args, refused, needle", [
    (["env.kwargs={size:4}"], "env.kwargs", "use env=guess_number, grid"),  # no env picked: say which to pick
    (["optim={lrr:1}"], "optim.lrr", "did you mean 'optim.lr'?"),            # the dict's unknown child is named
    (["optim.lrr=1"], "optim.lrr", "did you mean 'optim.lr'?"),
    (["eval", "env.kwargs={size:4}"], "env.kwargs", "use env=guess_number, grid"),
])
def test_unknown_key_never_suggests_itself(tmp_path, args, refused, needle):
    command = "eval" if args[0] == "eval" else "train"
    result = run_rlx([command, *[a for a in args if a != "eval"]], tmp_path)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and (f"'{refused}'" in lines[0] or f"{refused} is" in lines[0])
    assert needle in lines[0]
    assert f"did you mean '{refused}'" not in lines[0]
    assert not (tmp_path / "outputs").exists()


def test_unknown_key_message_excludes_the_refused_key():
    """Even when the refused key is a key of the config (a struct dict that refuses a child), the suggestion
    is another key: here 'env.kwargs' itself is in the composed config."""
    from rlx.config.overrides import check_overrides, unknown_key_message

    base = check_overrides(["algorithm=agent_grpo", "env=custom"])
    message = unknown_key_message("env.kwargs", None, base, "train")
    assert "did you mean 'env.kwargs'" not in message and message.startswith("error") is False
    # a key under a group nothing selected (sweep: null in conf/train.yaml) names the group to pick
    message = unknown_key_message("sweep.trials", None, check_overrides([]), "train")
    assert "no sweep is selected" in message and "sweep=" in message
