"""The Python API: rlx.fit / rlx.evaluate return directories and metrics; the example of docs/concepts.md runs."""

import re

import pytest

import rlx
from rlx.errors import UserError
from tests.conftest import REPO


def _readme_example() -> str:
    text = (REPO / "docs" / "concepts.md").read_text()
    block = text.split("<!-- PYTHON_API_EXAMPLE -->", 1)[1]
    return re.search(r"```python\n(.*?)```", block, re.DOTALL).group(1)


def test_readme_python_example_runs_verbatim(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RLX_OUTPUTS", str(tmp_path / "outputs"))
    namespace = {}
    exec(compile(_readme_example(), "docs/concepts.md", "exec"), namespace)
    run, report = namespace["run"], namespace["report"]
    assert run.run_dir.parent == (tmp_path / "outputs" / "train").resolve()
    assert (run.run_dir / "final" / "model.safetensors").is_file()
    assert 0.0 <= run.metrics["eval/accuracy"] <= 1.0 and "eval/tagged_answer" in run.metrics
    config = (run.run_dir / "config.yaml").read_text()
    # replaced the components; the config records where the callable was defined (here: exec'd, no module)
    assert ".tagged_answer" in config and "task_score" not in config and "rlx.api.registered" not in config
    assert "run directory:" in (run.run_dir / "train.log").read_text()  # logged as `rlx train` logs
    assert report.run_dir.parent == (tmp_path / "outputs" / "eval").resolve()
    assert "chain_sum" in report.metrics["benchmarks"]
    assert str(run.run_dir) in capsys.readouterr().out


def test_bad_override_raises_user_error_with_the_one_line_message(tmp_path, monkeypatch):
    monkeypatch.setenv("RLX_OUTPUTS", str(tmp_path / "outputs"))
    with pytest.raises(UserError,
                       match=r"unknown key 'num_generations' is a TRL name; in rlx set rollout.samples_per_prompt"):
        rlx.fit(["num_generations=4"])
    with pytest.raises(UserError, match="rewards= is empty"):
        rlx.fit([], rewards=[])
    assert not (tmp_path / "outputs").exists()


def test_fit_calls_the_training_function_directly_and_raises_the_runs_own_fault(tmp_path, monkeypatch):
    """rlx.fit composes the config and calls rlx.cli.train.train in this process: no command line in between
    (the CLI entry points are broken here), and a fault keeps its type instead of becoming a parsed stderr line."""
    from rlx.errors import RewardError

    monkeypatch.setenv("RLX_OUTPUTS", str(tmp_path / "outputs"))

    def no_cli(*args, **kwargs):
        raise AssertionError("rlx.fit went through the command line")

    monkeypatch.setattr("rlx.cli.main", no_cli)
    monkeypatch.setattr("rlx.cli._hydra_app", no_cli)

    def broken(completions, **kwargs):
        raise ValueError("this reward is broken")

    with pytest.raises(RewardError, match="this reward is broken"):
        rlx.fit(["steps=1", "prompts_per_step=2", "eval.size=4", "save.plot=false"], rewards=[broken])
