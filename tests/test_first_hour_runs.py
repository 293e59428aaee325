"""Issue 32, the first hour of a new user: a rejected command leaves no run directory, a healthy agent run looks
healthy (no empty `step 0/N` line, success and return in its progress lines), every command's closing `done:`
line names its directory, and `rlx report` states what it cannot know (one seed, different tasks, skipped
directories) and judges agent runs by eval/success. Commands run as a user types them, from a temporary
directory."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import run_rlx

SHORT = ["steps=2", "prompts_per_step=2", "rollout.samples_per_prompt=2", "eval.size=4", "eval.every=2",
         "rollout.max_new_tokens=8", "log.samples_every=0", "save.plot=false", "save.final=false",
         "hardware.num_threads=1"]
AGENT = ["algorithm=agent_grpo", "env=corridor", "model.path=builtin:tiny_agent", "data.source=none", "steps=4",
         "prompts_per_step=2", "rollout.samples_per_prompt=2", "env.eval_episodes=4", "eval.every=2",
         "log.samples_every=0", "save.plot=false", "save.final=false", "hardware.num_threads=1"]


@pytest.mark.parametrize("args", [
    ["train", "steps=-3"],                                             # the schema refuses it
    ["train", "data=file", "data.train_path=missing.jsonl"],           # found when the data loads
    ["train", "model.path=/nonexistent/model"],                        # found when the model loads
    ["eval", "limit=-1"],
])
def test_a_rejected_command_leaves_no_directory(tmp_path, args):
    result = run_rlx(args, tmp_path)
    assert result.returncode == 2 and result.stderr.strip().startswith("error: "), result.stderr[-2000:]
    kind = args[0]
    left = list((tmp_path / "outputs" / kind).iterdir()) if (tmp_path / "outputs" / kind).is_dir() else []
    assert left == []


def test_discard_unstarted_keeps_anything_a_start_did_not_write(tmp_path):
    """Only start-up files go: a directory with metrics, or with any file rlx did not write at start-up, stays whole."""
    from rlx.runtime.unstarted import discard_unstarted

    started = tmp_path / "started"
    (started / ".hydra").mkdir(parents=True)
    (started / "train.log").write_text("")
    (started / "metrics.jsonl").write_text('{"step": 0}\n')
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.yaml").write_text("a: 1\n")
    (mine / "notes.txt").write_text("the user's own file\n")
    unstarted = tmp_path / "unstarted"
    (unstarted / ".hydra").mkdir(parents=True)
    (unstarted / ".hydra" / "config.yaml").write_text("a: 1\n")
    (unstarted / "config.yaml").write_text("a: 1\n")
    (unstarted / "train.log").write_text("")
    assert not discard_unstarted(started) and (started / "metrics.jsonl").is_file()
    assert not discard_unstarted(mine) and (mine / "notes.txt").is_file()
    assert discard_unstarted(unstarted) and not unstarted.exists()


def _lines(result) -> list[str]:
    return [line for line in (result.stdout + result.stderr).splitlines() if "[rlx]" in line]


@pytest.fixture(scope="module")
def agent_run(tmp_path_factory):
    """A 4-step agent run on the corridor from the agent warm start (~10 s)."""
    home = tmp_path_factory.mktemp("agent")
    result = run_rlx(["train", *AGENT], home)
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = (home / "outputs" / "train").iterdir()
    return home, run, result


def test_agent_progress_lines_show_success_and_return(agent_run):
    home, run, result = agent_run
    lines = _lines(result)
    steps = [line.split(" - ", 1)[1] for line in lines if re.search(r" - step \d+/4", line)]
    assert steps and all(re.fullmatch(r"step \d+/4\s+\S.*", s) for s in steps), steps  # never an empty status
    assert any("eval success" in s for s in steps if s.startswith("step 0/4"))  # the start evaluation is shown
    assert all("success" in s and "return" in s for s in steps if not s.startswith("step 0/4"))
    done = [line.split(" - ", 1)[1] for line in lines if " - done: " in line]
    assert len(done) == 1 and done[0].startswith(f"done: {run}") and "eval/success=" in done[0]


@pytest.fixture(scope="module")
def task_runs(tmp_path_factory):
    """Two 2-step single-turn runs, on chain_sum and on reasoning-gym's gcd (~15 s), with the commands' output."""
    home = tmp_path_factory.mktemp("tasks")
    results = []
    for extra in ([], ["data=reasoning_gym", "data.task=gcd", "data.train_size=40", "data.eval_size=4"]):
        results.append(run_rlx(["train", *SHORT, *extra], home))
        assert results[-1].returncode == 0, results[-1].stderr[-3000:]
    return home, sorted((home / "outputs" / "train").iterdir()), results


def test_every_command_closes_with_a_done_line_naming_its_directory(task_runs, tmp_path):
    """rlx train (single-turn), rlx eval and rlx report end with `done: <their directory> ...`."""
    _, runs, results = task_runs
    for run, train in zip(runs, results):
        assert _lines(train)[-1].split(" - ", 1)[1].startswith(f"done: {run}  eval/accuracy=")
    evaluated = run_rlx(["eval", "limit=2", "sampling.n=2", "plot=false", "hardware.num_threads=1"], tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    (eval_dir,) = (tmp_path / "outputs" / "eval").iterdir()
    assert _lines(evaluated)[-1].split(" - ", 1)[1].startswith(f"done: {eval_dir}  chain_sum greedy/accuracy=")
    report = run_rlx(["report", str(runs[0]), "--out", str(tmp_path / "r")], tmp_path, timeout=120)
    assert report.returncode == 0, report.stderr[-2000:]
    assert report.stdout.strip().splitlines()[-1].startswith(f"done: {tmp_path / 'r'}  summary: ")


def test_report_of_agent_runs_defaults_to_success_and_says_n_is_one(agent_run, tmp_path):
    """One seed: the aggregate says it has no interval instead of printing `[x, x]`; an agent run is judged by
    eval/success (its optimized metric), not eval/accuracy, which it does not have."""
    home, run, _ = agent_run
    result = run_rlx(["report", str(run), "--out", str(tmp_path / "r")], home, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    success = json.loads((run / "result.json").read_text())["metrics"]["eval/success"]
    row = next(line for line in result.stdout.splitlines() if line.startswith("| c1 | eval/success | 1 |"))
    assert f"| {success:.3f} | {success:.3f} | n=1: no interval" in row
    assert not re.search(r"\[(\d\.\d{3}), \1\]", result.stdout)  # no degenerate interval anywhere
    assert "eval/accuracy" not in result.stdout


def test_report_remarks_on_different_tasks_and_lists_skipped_directories(task_runs, tmp_path):
    """A chain_sum run and a gcd run are compared with a remark; a folder that stopped before its first step is
    listed as skipped with its last log line."""
    import shutil

    home, runs, _ = task_runs
    for run in runs:
        shutil.copytree(run, tmp_path / "train" / run.name)
    crashed = tmp_path / "train" / "2026-01-01_00-00-00.000000_grpo"
    (crashed / ".hydra").mkdir(parents=True)
    (crashed / "train.log").write_text("[2026-01-01 00:00:00,000][rlx][INFO] - model: builtin:tiny\n")
    result = run_rlx(["report", str(tmp_path / "train")], tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "**Remark:** different tasks: c1 on data=chain_sum" in result.stdout and "c2 on data=gcd" in result.stdout
    assert "| c1 | c2 | eval/accuracy |" in result.stdout or "| c2 | c1 | eval/accuracy |" in result.stdout
    assert "no interval: 1 run(s) against 1" in result.stdout
    assert f"skipped {crashed}: no metrics.jsonl: the run stopped before its first logged step (last log line: " \
           f"model: builtin:tiny)" in result.stderr


def test_report_labels_stay_short(tmp_path):
    """Overrides of 400 characters (a long system prompt, a deep path) become a label of at most 80 characters;
    aggregates.csv keeps them whole."""
    import csv

    from rlx.report.remarks import LABEL_LIMIT, short_label
    from rlx.report.report import write_report

    long_prompt = "data.system_prompt=" + "be very careful " * 25
    deep = "data.train_path=/home/user/" + "nested/" * 20 + "mine.jsonl"
    assert len(long_prompt) + len(deep) > 400
    for name, overrides in (("a", [long_prompt, deep, "optim.lr=1e-4"]), ("b", ["optim.lr=3e-4"])):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "overrides.yaml").write_text("".join(f"- '{o}'\n" for o in [*overrides, "seed=0"]))
        (folder / "metrics.jsonl").write_text('{"step": 1, "eval/accuracy": 0.5}\n')
    result = write_report([tmp_path / "a", tmp_path / "b"], tmp_path / "report", n_resamples=50)
    labels = [g.label for g in result["groups"]]
    assert all(len(label) <= LABEL_LIMIT for label in labels), labels
    assert labels[0].endswith("(+2 more)") and labels[1] == "optim.lr=3e-4"
    assert short_label([deep]) == "data.train_path=mine.jsonl"
    with (tmp_path / "report" / "aggregates.csv").open() as handle:
        first = next(csv.DictReader(handle))
    assert deep in first["overrides"] and long_prompt.strip() in first["overrides"]
    assert short_label(["a=1", "b=2"]) == "a=1 b=2"
    assert short_label([f"k{i}=v" for i in range(40)], limit=20) == "k0=v k1=v (+38 more)"
