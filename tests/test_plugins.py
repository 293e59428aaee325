"""Extension without editing rlx (issue 26 item 6): a module of the user's, named in `plugins=[...]`, registers an
advantage estimator, a verifier and an environment with `@rlx.register(kind, name)`, and `rlx train` / `rlx eval`
run from the directory that holds it use them by name. Run through the installed `rlx` executable (not
`python -m rlx`), so the current directory being importable is rlx's doing."""

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rlx.config.plugins import import_plugins
from rlx.errors import UserError
from rlx.runtime.rundir import read_metrics
from tests.conftest import REPO, only_run_dir

PLUGIN = '''"""A user's plugin: an advantage estimator, a verifier and an environment."""
import json

import rlx
from rlx.algorithms.grouping import group_mean


@rlx.register("advantage", "my_mean", needs={"group_baseline": True})
def my_mean(rewards, group_ids, **knobs):
    """The group-mean baseline over group ids, shifted by 0.25 so that a test sees these advantages in
    train/advantage_mean."""
    with open("my_mean_calls.jsonl", "a") as f:
        f.write(json.dumps(rewards.tolist()) + "\\n")
    with open("my_mean_groups.jsonl", "a") as f:
        f.write(json.dumps(group_ids.tolist()) + "\\n")
    return rewards - group_mean(rewards, group_ids) + 0.25


@rlx.register("verifier", "my_exact")
def my_exact(extracted, problems):
    with open("my_exact_calls.txt", "a") as f:
        f.write(f"{len(extracted)}\\n")
    return [float(a is not None and a.strip() == p["answer"].strip()) for a, p in zip(extracted, problems)]


@rlx.register("env", "coin")
class Coin:
    """One turn: the episode succeeds when the characters of the action sum to an even number."""

    def reset(self, *, seed=None, options=None):
        with open("coin_resets.txt", "a") as f:
            f.write(f"{seed}\\n")
        return "flip", {}

    def step(self, action):
        win = float(sum(map(ord, action)) % 2 == 0)
        return "done", win, True, False, {"metrics": {"success": win}}
'''

SMALL = ["prompts_per_step=2", "rollout.samples_per_prompt=4", "eval.size=4", "eval.every=0", "eval.at_start=false",
         "log.samples_every=0", "save.final=false", "save.plot=false", "log.progress=false", "hardware.num_threads=1"]
AGENT = ["algorithm=gigpo", "env=custom", "env.name=coin", "model.path=builtin:tiny_agent", "data.source=none",
         "prompts_per_step=2", "rollout.samples_per_prompt=2", "env.eval_episodes=2", "eval.at_start=false",
         "save.final=false", "save.plot=false", "log.progress=false", "hardware.num_threads=1",
         "optimized_metric=eval/success"]


def rlx_command(args: list[str], cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    """The `rlx` executable of this environment, run in `cwd`, importing rlx from this checkout (PYTHONPATH holds
    the checkout only: the current directory is not on it)."""
    executable = Path(sys.executable).parent / "rlx"
    env = dict(os.environ, PYTHONPATH=str(REPO), RLX_OUTPUTS=str(cwd / "outputs"), HF_HUB_OFFLINE="1",
               HF_DATASETS_OFFLINE="1")
    return subprocess.run([str(executable), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def user_dir(tmp_path):
    (tmp_path / "my_plugin.py").write_text(PLUGIN)
    return tmp_path


def test_a_plugin_estimator_and_verifier_train_from_the_users_directory(user_dir):
    """~13 s. The estimator ran at each of the 2 steps on the 2 x 4 rewards, and its advantages are the ones the
    update used: their mean is its shift 0.25 (a group-centred baseline alone averages 0). The verifier scored
    the completions (reward=task uses data.verifier)."""
    result = rlx_command(["train", "plugins=[my_plugin]", "algorithm.advantage=my_mean", "data.verifier=my_exact",
                          "steps=2", *SMALL], user_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    calls = [json.loads(line) for line in (user_dir / "my_mean_calls.jsonl").read_text().splitlines()]
    assert [len(rewards) for rewards in calls] == [8, 8]
    rows = [r for r in read_metrics(only_run_dir(user_dir) / "metrics.jsonl") if "train/advantage_mean" in r]
    assert len(rows) == 2 and all(abs(r["train/advantage_mean"] - 0.25) < 1e-6 for r in rows)
    assert (user_dir / "my_exact_calls.txt").read_text().splitlines()[:2] == ["8", "8"]


def test_a_plugin_estimator_takes_the_hinted_groups_of_different_sizes(user_dir):
    """~40 s. Hints add 4 re-samples to each all-fail group (chain_sum with 2-4 terms: about half the groups of 4 fail
    at the start), so the group ids the plugin's estimator receives name groups of 4 and of 8 in one batch; it runs
    unchanged, with no rule of rlx naming it."""
    small = [o for o in SMALL if not o.startswith("prompts_per_step=")]
    result = rlx_command(["train", "plugins=[my_plugin]", "algorithm.advantage=my_mean", "algorithm.hints.enabled=true",
                          "data.task_config.max_terms=4", "prompts_per_step=4", "steps=2", *small], user_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    calls = [json.loads(line) for line in (user_dir / "my_mean_groups.jsonl").read_text().splitlines()]
    sizes = [sorted({ids.count(g) for g in ids}) for ids in calls]
    assert len(calls) == 2 and [4, 8] in sizes, sizes


def test_a_plugin_environment_trains_and_evaluates(user_dir):
    """~9 s each. `env=custom env.name=coin` plays the plugin's environment (its resets are recorded) in
    training, and `rlx eval run=<that run>` plays it again without being told the plugin (the run's config
    names it)."""
    result = rlx_command(["train", "plugins=[my_plugin]", *AGENT, "steps=1"], user_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    run = only_run_dir(user_dir)
    last = read_metrics(run / "metrics.jsonl")[-1]
    assert "env/success" in last and "eval/success" in last
    trained = len((user_dir / "coin_resets.txt").read_text().splitlines())
    assert trained >= 4 + 2  # 2 prompts x 2 episodes, then 2 held-out episodes
    result = rlx_command(["eval", f"run={run}", "checkpoint=step_1", "limit=2", "sampling.n=1", "sampling.greedy=false",
                          "progress=false", "plot=false", "hardware.num_threads=1"], user_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((only_run_dir(user_dir, "eval") / "summary.json").read_text())
    assert "success" in summary["benchmarks"]["env_coin"]["model"]
    # 2 held-out episodes, after the start-up probe of their 2 first observations (rlx/rollout/budgets.py)
    assert len((user_dir / "coin_resets.txt").read_text().splitlines()) == trained + 2 + 2


def test_a_misspelled_name_lists_the_live_choices_with_the_plugins(user_dir):
    result = rlx_command(["train", "plugins=[my_plugin]", "algorithm.advantage=my_meen", "steps=1"], user_dir)
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        "error: unknown algorithm.advantage 'my_meen'; valid choices: grpo, rloo, reinforce_pp, reinforce_pp_baseline, "
        "median, ngrpo, my_mean, gae"]
    for command in (["train", "algorithm=gigpo", "steps=1"], ["eval"]):  # eval.yaml has plugins too
        result = rlx_command([*command, "plugins=[my_plugin]", "env=custom", "env.name=con"], user_dir)
        assert result.returncode == 2 and result.stderr.strip().splitlines() == [
            "error: unknown env.name 'con'; valid choices: guess_number, grid, corridor, tool_use, mixture, coin, "
            "custom, harness"]


def test_a_broken_plugin_is_one_line_naming_the_cause_and_the_line(tmp_path):
    (tmp_path / "broken_plugin.py").write_text('"""A plugin with a typo in an import."""\n\nimport numpyy\n')
    result = rlx_command(["train", "plugins=[broken_plugin]", "steps=1"], tmp_path)
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        "error: plugin 'broken_plugin' failed to import: No module named 'numpyy' (broken_plugin.py, line 3)"]
    assert not (tmp_path / "outputs").exists()  # stopped before Hydra made a run directory


def _write(directory: Path, name: str, text: str) -> None:
    (directory / f"{name}.py").write_text(text)


@pytest.fixture
def on_path(tmp_path, monkeypatch):
    """tmp_path on sys.path and as the current directory; the modules imported from it are forgotten after."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        if getattr(sys.modules[name], "__file__", None) and str(tmp_path) in sys.modules[name].__file__:
            del sys.modules[name]


@pytest.mark.parametrize("source,message", [
    ("x = 1\ny = (\n", "plugin 'plug_a' failed to import: SyntaxError: '(' was never closed (plug_a.py, line 2)"),
    ("import json\nraise RuntimeError('no config here')\n",
     "plugin 'plug_a' failed to import: RuntimeError: no config here (plug_a.py, line 2)"),
    ("import rlx\n\n\n@rlx.register('advantage', 'grpo')\ndef mine(*args, **knobs):\n    pass\n",
     "plugin 'plug_a' failed to import: ValueError: outcome advantage estimator 'grpo' is registered twice (already by "
     "rlx.algorithms.advantages.grpo_estimator); pick another name (plug_a.py, line 4)"),
    ("import rlx\nrlx.register('advantages', 'x')\n",
     "plugin 'plug_a' failed to import: UnknownName: unknown registry kind 'advantages'; valid kinds: advantage,"),
])
def test_what_a_plugin_raises_is_one_line_with_its_place(on_path, source, message):
    _write(on_path, "plug_a", source)
    with pytest.raises(UserError) as info:
        import_plugins(["plug_a"])
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_plugins_is_a_list_of_importable_module_names(on_path):
    with pytest.raises(UserError,
                       match=r"^plugin 'no_such_plugin_xyz' not found: No module named 'no_such_plugin_xyz'; "):
        import_plugins(["no_such_plugin_xyz"])
    with pytest.raises(UserError, match=r"^plugins=my_module is not valid: it must be a list of module names"):
        import_plugins("my_module")
    with pytest.raises(UserError, match=r"^plugins entry 'my-module' is not a module name"):
        import_plugins(["my-module"])
    _write(on_path, "plug_b", "import json\nCOUNT = [0]\nCOUNT[0] += 1\n")
    assert import_plugins(["plug_b", "plug_b"]) == ["plug_b", "plug_b"] and sys.modules["plug_b"].COUNT == [1]
    assert import_plugins(None) == [] and import_plugins([]) == []


def test_the_python_api_imports_plugins_before_it_checks(on_path):
    """rlx.fit composes and checks the config (check_overrides) before anything runs: a misspelled name is
    refused with the plugin's name among the choices, before any model loads."""
    import rlx
    from rlx.algorithms.advantages import OUTCOME_ESTIMATORS

    _write(on_path, "plug_c", "import rlx\n\n\n@rlx.register('advantage', 'plug_c_mean')\n"
                              "def plug_c_mean(rewards, group_ids, **knobs):\n    return rewards * 0\n")
    try:
        with pytest.raises(UserError, match=r"unknown algorithm.advantage 'plug_c_meen'; valid choices: .*ngrpo, "
                                            r"plug_c_mean, gae$"):
            rlx.fit(["plugins=[plug_c]", "algorithm.advantage=plug_c_meen", "steps=1"])
    finally:
        if "plug_c_mean" in OUTCOME_ESTIMATORS:
            OUTCOME_ESTIMATORS.unregister("plug_c_mean")


def test_the_plugins_page_lists_every_kind_and_its_examples_work(on_path):
    """docs/extending/plugins.md: its table has one row per kind, in KINDS' order, and its Python examples, imported
    as plugins, register what they say and compute what they say: my_mean on rewards [1, 0, 0, 1] with group ids
    [3, 8, 3, 8] gives r - mean(group) = [0.5, -0.5, -0.5, 0.5]; case_insensitive takes the last word 'PARIS' of the
    completion and matches the reference 'paris'; coin's action 'b' (98, even) succeeds."""
    import torch

    from rlx.algorithms.advantages import OUTCOME_ESTIMATORS
    from rlx.cli.registries import KINDS
    from rlx.envs import ENVIRONMENTS
    from rlx.tasks import VERIFIERS

    page = (REPO / "docs" / "extending" / "plugins.md").read_text()
    assert re.findall(r"^\| `(\w+)` \|", page, flags=re.M) == list(KINDS)
    blocks = [textwrap.dedent(body) for _indent, body in
              re.findall(r"^( *)```python\n(.*?)^ *```", page, flags=re.M | re.S)]
    assert len(blocks) == 3
    for i, block in enumerate(blocks):
        _write(on_path, f"page_example_{i}", block)
    try:
        import_plugins([f"page_example_{i}" for i in range(len(blocks))])
        adv = OUTCOME_ESTIMATORS["my_mean"](torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.tensor([3, 8, 3, 8]))
        assert adv.tolist() == [0.5, -0.5, -0.5, 0.5] and OUTCOME_ESTIMATORS.needs("my_mean").group_baseline
        assert VERIFIERS["case_insensitive"].score(["The capital is PARIS"],
                                                   [{"answer": "paris"}]) == (["PARIS"], [1.0])
        env = ENVIRONMENTS["coin"]()
        assert env.reset(seed=0)[0] == "flip" and env.step("b")[1] == 1.0
    finally:
        for registry, name in ((OUTCOME_ESTIMATORS, "my_mean"), (VERIFIERS, "case_insensitive"),
                               (ENVIRONMENTS, "coin")):
            if name in registry:
                registry.unregister(name)


@pytest.mark.long
def test_worker_processes_import_the_plugins_too(user_dir):
    """hardware=ddp with 2 processes: each worker (started with the same overrides) imports the plugin and
    computes the batch's advantages with it (2 steps x 2 ranks calls). ~20 s."""
    result = rlx_command(["train", "plugins=[my_plugin]", "algorithm.advantage=my_mean", "hardware=ddp",
                          "hardware.cpu=true", "hardware.num_processes=2", "steps=2", *SMALL], user_dir, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    calls = (user_dir / "my_mean_calls.jsonl").read_text().splitlines()
    assert len(calls) == 4, calls
