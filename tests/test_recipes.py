"""Every recipe states its command, source, hardware and expected numbers, composes, and runs for 1 step.

The 1-step runs are four multiruns (one process each, so ~20 recipes cost seconds each, not a
process start each): CPU-scale recipes as they are, GPU-scale policy-gradient recipes with the tiny
model on chain_sum (those mixing several reasoning-gym tasks on their own tasks), GPU-scale preference
recipes with the tiny model on data=prefs. Sizes are shrunk
to a few sequences; what is checked is that the recipe's algorithm settings compose and run.
"""

import json

import pytest

from rlx.cli.recipes import (
    compare,
    cpu_recipes,
    expected,
    header,
    recipe_names,
    table_markdown,
    write_results_table,
)
from rlx.config.overrides import check_overrides
from rlx.config.paths import RECIPES_DIR
from tests.conftest import run_rlx

RECIPES = recipe_names()
# the seed ideas' ablation recipes (docs/algorithms/seed-ideas.md): their options train two steps each in
# tests/test_seed_wiring.py and their presets in tests/test_pg_presets.py, so their own 1-step runs are `slow`
ABLATION = [name for name in RECIPES if name.startswith("seed_")]
SOURCELESS = {"tiny_sft", "tiny_agent_sft"}  # rlx's own model-building recipes: no paper to cite
ONE_STEP = ["steps=1", "prompts_per_step=2", "rollout.samples_per_prompt=4", "micro_batch_size=8", "eval.size=4",
            "eval.batch_size=4", "eval.every=1", "rollout.max_new_tokens=16", "log.samples_every=0", "save.final=false",
            "save.plot=false", "hardware.num_threads=1"]
ON_TINY = ["model=tiny", "model.path=builtin:tiny", "hardware=cpu", "hardware.num_threads=1"]


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_header_states_command_source_hardware_expected(name):
    info = header(name)
    text = (RECIPES_DIR / f"{name}.yaml").read_text()
    assert text.startswith("# @package _global_\n")
    assert info["command"].startswith(f"rlx train {name}")
    assert info["description"], "the first comment after the command is the one-line description"
    assert info["expected"], "a '# Expected:' line"
    assert info["hardware"] or "(" in info["command"]
    if name not in SOURCELESS:
        assert info["source"] and ("20" in info["source"]), "a '# Source:' line naming the paper and year"
    if name.endswith("_tiny") or name.startswith("smollm2_"):  # CPU-scale: measured here, a machine-readable block
        spec = expected(name)
        assert spec is not None and spec["metric"].count("/") == 1 and spec["tolerance"] >= 0
    else:
        assert "paper reports" in info["expected"].lower() or name in SOURCELESS


def _composed(name):
    try:
        return check_overrides([f"recipes={name}"]), ""
    except SystemExit:  # check_overrides printed the one-line error
        return None, "does not compose (a preset it names is missing?)"


@pytest.fixture(scope="module")
def one_step_runs(tmp_path_factory):
    """recipe -> (run directory or None, why not), for every recipe but the ablation's."""
    return _one_step_runs(tmp_path_factory.mktemp("recipes"), [n for n in RECIPES if n not in ABLATION])


def _one_step_runs(tmp, recipes: list[str]) -> dict:
    batches: dict[str, tuple[list[str], list[str]]] = {"cpu": ([], []),
                                                       "pg": ([], ON_TINY + ["data=chain_sum", "reward=task"]),
                                                       "mix": ([], ON_TINY + ["reward=task"]),
                                                       "pref": ([], ON_TINY + ["data=prefs"])}
    status = {}
    for name in recipes:
        cfg, why = _composed(name)
        if cfg is None:
            status[name] = (None, why)
            continue
        if name in cpu_recipes() or cfg.model.path is None or str(cfg.model.path).startswith("builtin:"):
            batch = "cpu"
        elif cfg.algorithm.family in ("policy_gradient", "ppo"):
            # a mixture of reasoning-gym tasks (generated offline) keeps its own data: chain_sum's would replace them
            batch = "mix" if cfg.data.source == "reasoning_gym" and not isinstance(cfg.data.task, str) else "pg"
        else:
            batch = "pref"
        batches[batch][0].append(name)
    for batch, (names, extra) in batches.items():
        if not names:
            continue
        sweep = tmp / batch
        result = run_rlx(["train", "-m", f"recipes={','.join(names)}", *ONE_STEP, *extra, f"hydra.sweep.dir={sweep}"],
                         tmp, timeout=900)
        for index, name in enumerate(names):
            trial = sweep / str(index)
            if (trial / "result.json").is_file():
                status[name] = (trial, "")
            elif (trial / "failure.json").is_file():
                status[name] = (None, json.loads((trial / "failure.json").read_text())["error"])
            else:
                status[name] = (None, f"no trial directory (multirun exit {result.returncode}): {result.stderr[-800:]}")
    return status


@pytest.mark.parametrize("name", [n for n in RECIPES if n not in ABLATION])
def test_recipe_runs_one_step(name, one_step_runs):
    _ran_one_step(name, one_step_runs)


@pytest.mark.long
def test_ablation_recipes_run_one_step(tmp_path):
    status = _one_step_runs(tmp_path, ABLATION)
    for name in ABLATION:
        _ran_one_step(name, status)


def _ran_one_step(name: str, status: dict) -> None:
    trial, why = status[name]
    assert trial is not None, f"recipe {name}: {why}"
    rows = [json.loads(line) for line in (trial / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 1 and "train/loss" in rows[-1]


def test_reproduce_compares_with_tolerance_and_writes_the_results_table(tmp_path):
    spec = {"metric": "eval/accuracy", "value": 0.6, "tolerance": 0.05}
    # mean of (0.5, 0.6, 0.7) = 0.6, sample std = sqrt((0.01 + 0 + 0.01) / 2) = 0.1
    ok = compare([0.5, 0.6, 0.7], spec)
    assert ok["status"] == "ok" and ok["mean"] == pytest.approx(0.6) and ok["std"] == pytest.approx(0.1)
    assert compare([0.5, 0.5, 0.5], spec)["status"] == "LOWER"  # |0.5 - 0.6| = 0.1 > 0.05
    assert compare([0.7, 0.7], spec)["status"] == "HIGHER"
    assert compare([0.4], {**spec, "value": None})["status"] == "not yet expected"
    ok["recipe"] = "grpo_tiny"
    table = table_markdown([ok], 3)
    assert "| grpo_tiny | eval/accuracy | 0.60 ± 0.05 | 0.600 ± 0.100 |" in table
    # the results file keeps only current figures: grpo_tiny's old row goes, dpo_tiny's stays under its own date
    results = tmp_path / "recipes_tiny.json"
    old = {"caption": "old", "date": "2026-01-01", "machine": "m", "load": "l", "command": "c", "columns": ["recipe"],
           "rows": [["grpo_tiny"], ["dpo_tiny"]]}
    gone = {**old, "rows": [["grpo_tiny"]]}
    results.write_text(json.dumps({"title": "t", "section": "s", "tables": [old, gone]}))
    assert write_results_table([ok], 3, "rlx recipes reproduce grpo_tiny", results, date="2026-11-25")
    tables = json.loads(results.read_text())["tables"]
    assert [t["rows"] for t in tables] == [[["grpo_tiny", "eval/accuracy", "0.60 ± 0.05", "0.600 ± 0.100",
                                             tables[0]["rows"][0][4], "ok"]], [["dpo_tiny"]]]
    assert tables[0]["date"] == "2026-11-25" and tables[0]["command"] == "rlx recipes reproduce grpo_tiny"
    assert tables[0]["machine"] and tables[0]["load"].startswith("load average") and tables[1]["date"] == "2026-01-01"


def test_recipes_list_and_show(tmp_path):
    listed = run_rlx(["recipes"], tmp_path, timeout=120)
    assert listed.returncode == 0
    for name in RECIPES:
        assert name in listed.stdout
    shown = run_rlx(["recipes", "show", "grpo_tiny"], tmp_path, timeout=120)
    assert shown.returncode == 0 and shown.stdout == (RECIPES_DIR / "grpo_tiny.yaml").read_text()
    missing = run_rlx(["recipes", "show", "grpo_tiyn"], tmp_path, timeout=120)
    assert missing.returncode == 2 and "unknown recipe 'grpo_tiyn' (did you mean 'grpo_tiny'?)" in missing.stderr


@pytest.mark.long  # a 2-seed multirun of grpo_tiny through `rlx recipes reproduce` (make test-long)
def test_reproduce_command_runs_a_recipe_and_reports(tmp_path):
    out = tmp_path / "repro"
    result = run_rlx(["recipes", "reproduce", "grpo_tiny", "--seeds", "2", "--out", str(out),
                      *[f"--set={o}" for o in ONE_STEP]], tmp_path)
    # one step cannot reach the recipe's expected accuracy: exit 1 naming it, unless it lands inside by chance
    assert (result.returncode == 0
            or "outside their tolerance or failed: grpo_tiny" in result.stderr), result.stderr[-3000:]
    finals = [json.loads((out / "grpo_tiny" / str(i) / "result.json").read_text())["metrics"]["eval/accuracy"]
              for i in range(2)]
    table = (out / "reproduce.md").read_text()
    assert "| grpo_tiny | eval/accuracy |" in table and f"{sum(finals) / 2:.3f} ± " in table
    again = run_rlx(["recipes", "reproduce", "grpo_tiny", "--seeds", "2", "--out", str(out), "--reuse"],
                    tmp_path, timeout=120)
    # finished seeds are reused, nothing re-runs
    assert again.returncode == result.returncode and "$ " not in again.stdout


@pytest.mark.parametrize("values, code", [((0.1, 0.12), 1), (None, 0)])
def test_reproduce_exit_code_follows_the_tolerance_and_leaves_the_results_alone(tmp_path, values, code):
    """Finished seeds are reused (--reuse), so this checks the verdict without training: far from the
    expected value -> exit 1 naming the recipe; at the expected value -> 0. The results file is never written
    without --update-results."""
    from tests.conftest import REPO

    spec = expected("grpo_tiny")
    values = values or (spec["value"], spec["value"])
    out = tmp_path / "repro"
    for seed, value in enumerate(values):
        trial = out / "grpo_tiny" / str(seed)
        (trial / ".hydra").mkdir(parents=True)
        (trial / "result.json").write_text(json.dumps({"status": "ok", "metrics": {spec["metric"]: value}}))
    results = (REPO / "benchmarks" / "results" / "recipes_tiny.json").read_bytes()
    result = run_rlx(["recipes", "reproduce", "grpo_tiny", "--seeds", "2", "--out", str(out), "--reuse"], tmp_path,
                     timeout=120)
    assert result.returncode == code, result.stderr
    if code:
        assert result.stderr.strip() == "error: 1 of 1 recipes outside their tolerance or failed: grpo_tiny"
    assert (REPO / "benchmarks" / "results" / "recipes_tiny.json").read_bytes() == results
    assert (out / "reproduce.md").is_file()
