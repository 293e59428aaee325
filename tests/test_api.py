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
    assert "rlx.api.registered.tagged_answer" in config and "task_score" not in config  # replaced the components
    assert report.run_dir.parent == (tmp_path / "outputs" / "eval").resolve()
    assert "chain_sum" in report.metrics["benchmarks"]
    assert str(run.run_dir) in capsys.readouterr().out


def test_bad_override_raises_user_error_with_the_one_line_message(tmp_path, monkeypatch):
    monkeypatch.setenv("RLX_OUTPUTS", str(tmp_path / "outputs"))
    with pytest.raises(UserError, match=r"unknown key 'num_generations' is a TRL name; in rlx set rollout.samples_per_prompt"):
        rlx.fit(["num_generations=4"])
    with pytest.raises(UserError, match="rewards= is empty"):
        rlx.fit([], rewards=[])
    assert not (tmp_path / "outputs").exists()
