"""rlx view's data layer on hand-made run directories (fast): run discovery, the incremental metrics reader,
metric grouping, samples grouping and filters, health flags on hand-made metrics, seed bands, config diff,
eval disagreements, the export and the served routes. The page itself in a browser: tests/test_view_browser.py."""

import json
import math
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import yaml

from rlx.report.stats import t_critical_value
from rlx.view import health
from rlx.view.app import Library, create_app, export, free_socket
from rlx.view.data import MetricsTail, config_diff, discover, group_metrics, metric_group, seed_bands
from rlx.view.evals import disagreements
from rlx.view.samples import filter_groups, prompt_groups, read_samples


def write_run(path, rows, overrides=(), config=None, samples=None):
    """A run directory as rlx train leaves it: metrics.jsonl, overrides.yaml, config.yaml, samples/."""
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "overrides.yaml").write_text(yaml.safe_dump(list(overrides)))
    (path / "config.yaml").write_text(yaml.safe_dump(config
                                                     or {"prompts_per_step": 2, "rollout": {"samples_per_prompt": 2}}))
    for step, records in (samples or {}).items():
        (path / "samples").mkdir(exist_ok=True)
        (path / "samples" / f"step_{step:06d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def record(prompt, reward, correct, group, truncated=False, completion="x"):
    return {"prompt": prompt, "completion": completion, "reward": reward, "advantage": 0.0, "answer": "7",
            "group": group, "length": 3, "truncated": truncated, "correct": correct,
            "components": {"task": float(correct), "format": 1.0}}


# ------------------------------------------------------------------------------------------------ discovery
def test_discover_finds_runs_sweep_trials_and_eval_dirs_and_names_a_folder_without_runs(tmp_path):
    write_run(tmp_path / "run", [{"step": 1, "reward/total": 0.5}])
    for trial in ("1", "0", "10"):
        write_run(tmp_path / "sweep" / trial, [{"step": 1}], overrides=[f"seed={trial}"])
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "summary.json").write_text(json.dumps({"benchmarks": {}}))
    (tmp_path / "empty").mkdir()
    runs, notes = discover([tmp_path / "run", tmp_path / "sweep", tmp_path / "eval", tmp_path / "empty",
                            tmp_path / "run"])
    assert [(r.name, r.kind) for r in runs] == [("run", "train"), ("sweep/0", "train"), ("sweep/1", "train"),
                                                 ("sweep/10", "train"), ("eval", "eval")]
    assert [r.seed for r in runs[1:4]] == [0, 1, 10]
    assert runs[1].config_group == runs[2].config_group == ()  # seeds of one configuration
    assert len(notes) == 1 and "empty is not a run" in notes[0]


def test_rlx_view_on_a_path_that_is_not_a_directory_is_one_line_exit_2(tmp_path, rlx_cli):
    result = rlx_cli(["view", str(tmp_path / "missing")], tmp_path, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "is not a directory" in result.stderr


# ------------------------------------------------------------------------------------------------ metrics
def test_metrics_tail_reads_appended_rows_keeps_a_half_written_line_and_notes_damage(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "time": 10.0, "reward/total": 0.5}\nnot json\n{"step": 2, "reward/total": Na')
    tail = MetricsTail(path)
    assert tail.update() == 1 and tail.pending  # the cut-short line waits
    assert tail.step == [1] and tail.columns["reward/total"] == [0.5]
    assert tail.notes == ["metrics.jsonl line 2 is not JSON (Expecting value); left out"]
    with path.open("a") as handle:  # the writer finishes its line, then adds one with a new metric
        handle.write('N, "train/loss": Infinity}\n{"step": 3, "reward/total": 0.7, "train/kl_ref": 0.1}\n')
    assert tail.update() == 2 and not tail.pending
    assert tail.step == [1, 2, 3]
    assert tail.columns["reward/total"] == [0.5, None, 0.7]  # NaN is a gap
    assert tail.columns["train/kl_ref"] == [None, None, 0.1]  # a metric that appears late is aligned
    assert tail.nonfinite == {"reward/total": 1, "train/loss": 1} and tail.first_nonfinite["train/loss"] == 2
    assert tail.curve("reward/total") == ([1, 3], [0.5, 0.7])
    since = tail.since(2)
    assert since["step"] == [3] and since["metrics"]["train/kl_ref"] == [0.1] and since["rows"] == 3
    assert tail.update() == 0


def test_metric_groups_follow_the_documented_grouping():
    names = ["reward/total", "reward/format", "reward/accuracy", "eval/accuracy", "completions/mean_length",
             "train/kl_ref", "train/approx_kl", "train/entropy", "train/clip_frac_low", "train/grad_norm",
             "rollout/staleness_max", "perf/tokens_per_s", "train/loss", "env/success", "eval/truncated_frac"]
    groups = {g["title"]: g["metrics"] for g in group_metrics(names)}
    assert list(groups) == ["Accuracy", "Reward and its components", "Lengths", "KL", "Entropy", "Clip fractions",
                            "Gradient norm", "Staleness", "Throughput", "Loss, advantages and the rest"]
    assert groups["Accuracy"] == ["env/success", "eval/accuracy", "reward/accuracy"]
    assert groups["Reward and its components"] == ["reward/format", "reward/total"]
    assert groups["Lengths"] == ["completions/mean_length", "eval/truncated_frac"]
    assert groups["KL"] == ["train/approx_kl", "train/kl_ref"]
    assert metric_group("train/loss") == "Loss, advantages and the rest"


def test_seed_bands_are_the_reports_mean_and_t_band(tmp_path):
    tails = []
    for seed, values in enumerate([(1.0, 4.0), (2.0, 5.0), (3.0, 9.0)]):
        path = tmp_path / f"m{seed}.jsonl"
        rows = [{"step": s, "reward/total": v}
                for s, v in zip((1, 2), values)] + ([{"step": 3, "reward/total": 1.0}] if seed else [])
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        tails.append(MetricsTail(path))
        tails[-1].update()
    band = seed_bands(tails, ["reward/total", "absent"])
    assert list(band) == ["reward/total"]
    assert band["reward/total"]["step"] == [1, 2]  # step 3 is not logged by every seed
    assert band["reward/total"]["mean"] == pytest.approx([2.0, 6.0])
    half = t_critical_value(0.95, 2) * np.array([1.0, math.sqrt(7.0)]) / math.sqrt(3)  # sample std 1 and sqrt(7)
    assert band["reward/total"]["high"] == pytest.approx(list(np.array([2.0, 6.0]) + half))
    assert band["reward/total"]["low"] == pytest.approx(list(np.array([2.0, 6.0]) - half))


# ------------------------------------------------------------------------------------------------ samples
def step_records():
    return [record("p1", 1.0, True, 0), record("p1", 1.0, True, 0),
            record("p2", 0.0, False, 1, truncated=True), record("p2", 0.0, False, 1, completion="forty-two"),
            record("p3", 1.0, True, 2), record("p3", 0.0, False, 2)]


def test_prompt_groups_kinds_tied_truncated_and_filters():
    groups = prompt_groups(step_records())
    assert [(g["prompt"], g["kind"], g["tied"], g["truncated"]) for g in groups] == [
        ("p1", "right", True, False), ("p2", "wrong", True, True), ("p3", "mixed", False, False)]
    assert groups[2]["completions"][0]["components"] == {"task": 1.0, "format": 1.0}
    prompts = {kind: [g["prompt"] for g in filter_groups(groups, kind)] for kind in
               ("all", "wrong", "right", "mixed", "truncated", "tied")}
    assert prompts == {"all": ["p1", "p2", "p3"], "wrong": ["p2"], "right": ["p1"], "mixed": ["p3"],
                       "truncated": ["p2"], "tied": ["p1", "p2"]}
    assert [g["prompt"] for g in filter_groups(groups, "all", "FORTY")] == ["p2"]  # a completion's text, any case
    assert [g["prompt"] for g in filter_groups(groups, "wrong", "p3")] == []
    with pytest.raises(ValueError, match="unknown filter"):
        filter_groups(groups, "bogus")


def test_samples_without_group_ids_or_verdicts_group_by_prompt_and_agents_show_turns():
    old = [{"prompt": "a", "completion": "1", "reward": 0.0}, {"prompt": "a", "completion": "2", "reward": 1.0},
           {"prompt": "b", "completion": "3", "reward": 0.0}]
    groups = prompt_groups(old)
    assert [(g["prompt"], len(g["completions"]), g["kind"])
            for g in groups] == [("a", 2, "unknown"), ("b", 1, "unknown")]
    same_start = [{"observations": ["map"], "actions": ["x"], "rewards": [float(i % 2)], "success": float(i % 2)}
                  for i in range(4)]  # two groups of 2 episodes on one fixed layout
    assert [len(g["completions"]) for g in prompt_groups(same_start, group_size=2)] == [2, 2]
    assert [len(g["completions"]) for g in prompt_groups(same_start)] == [4]
    episode = {"observations": ["start", "wall"], "actions": ["left", "up"], "rewards": [0.0, 1.0], "success": 1.0,
               "truncated": False, "error": None, "advantages": [0.2, 0.8]}
    (group,) = prompt_groups([episode])
    (played,) = group["completions"]
    assert group["prompt"] == "start" and group["kind"] == "right" and played["reward"] == 1.0
    assert (played["length"], played["length_unit"]) == (2, "turns")
    assert played["turns"] == [{"observation": "start", "action": "left", "reward": 0.0, "credit": 0.2},
                               {"observation": "wall", "action": "up", "reward": 1.0, "credit": 0.8}]


def test_a_samples_file_that_is_not_utf8_is_read_with_a_note(tmp_path):
    path = tmp_path / "step_000001.jsonl"
    path.write_bytes(b'{"prompt": "caf\xe9", "completion": "ok", "reward": 1.0}\n{"prompt": "x", "comp')
    records, notes = read_samples(path)
    assert records[0]["prompt"] == "caf\ufffd"
    assert "not UTF-8" in notes[0] and "line 2 is being written" in notes[1]


# ------------------------------------------------------------------------------------------------ health
def tail_of(tmp_path, rows):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tail = MetricsTail(path)
    tail.update()
    return tail


def raised(tmp_path, rows, config=None):
    return {f.name: f for f in health.health_flags(tail_of(tmp_path, rows), config or {})}


def test_a_healthy_run_raises_no_flag(tmp_path):
    rows = [{"step": s, "train/entropy": 1.0 - 0.01 * s, "reward/total": 0.1 * s, "train/kl_ref": 0.01,
             "train/frac_zero_std_groups": 0.5, "completions/truncated_frac": 0.1, "rollout/staleness_max": 1.0,
             **({"eval/accuracy": 0.1 * s} if s % 3 == 0 else {})} for s in range(1, 13)]
    assert raised(tmp_path, rows, {"rollout": {"max_staleness": 1, "max_new_tokens": 64}}) == {}


@pytest.mark.parametrize("name, rows, config, words", [
    ("entropy collapse", [{"step": s, "train/entropy": e} for s, e in enumerate([1.0, 0.5, 0.09])], {},
     "fell from 1 (step 0) to 0.09 (step 2)"),
    ("entropy collapse", [{"step": s, "train/entropy": e} for s, e in enumerate([0.05, 0.04, 0.009])], {},
     "to 0.009"),
    ("reward up, held-out accuracy down",
     [{"step": s, "reward/total": 0.1 * s, **({"eval/accuracy": a} if a is not None else {})}
      for s, a in enumerate([0.5, None, 0.6, None, 0.5, None, 0.4])], {},
     "after step 2 while eval/accuracy fell from 0.6 to 0.4"),
    ("length at the budget", [{"step": s, "completions/truncated_frac": 0.6} for s in range(6)],
     {"rollout": {"max_new_tokens": 32}}, "60% of completions were cut at the budget over the last 5 logged steps "
                                          "(rollout.max_new_tokens=32)"),
    ("KL spike", [{"step": s, "train/kl_ref": v} for s, v in enumerate([0.01] * 6 + [0.5])], {},
     "train/kl_ref jumped to 0.5 at step 6"),
    ("groups all tied", [{"step": s, "train/frac_zero_std_groups": 1.0} for s in range(5)], {},
     "identical rewards for 5 steps in a row (up to step 4)"),
    ("non-finite values", [{"step": 1, "train/loss": 0.1}, {"step": 2, "train/loss": float("nan")}], {},
     "1 non-finite value(s) in 1 metric(s) skipped in the curves; the first: train/loss at step 2"),
    ("staleness above its bound", [{"step": s, "rollout/staleness_max": v} for s, v in enumerate([1.0, 2.0, 3.0])],
     {"rollout": {"max_staleness": 2}}, "reached 3 at step 2, above rollout.max_staleness=2"),
])
def test_each_health_flag_on_hand_made_metrics(tmp_path, name, rows, config, words):
    flags = raised(tmp_path, rows, config)
    assert list(flags) == [name]
    assert words in flags[name].reason
    assert flags[name].anchor == health.FLAGS[name][0]


def test_health_flags_stay_quiet_just_below_their_thresholds(tmp_path):
    rows = [{"step": s, "train/entropy": e, "train/kl_ref": k, "train/frac_zero_std_groups": z}
            for s, (e, k, z) in enumerate(zip([1.0, 0.5, 0.11, 0.2, 0.2, 0.2, 0.2], [0.0001] * 6 + [0.009],
                                              [1.0, 1.0, 1.0, 1.0, 0.9, 1.0, 1.0]))]
    # entropy at 0.2 > 0.1 x 1.0; the KL jump (90x its median) stays under KL_SPIKE_MIN; the tied streak breaks at step
    # 4
    assert raised(tmp_path, rows) == {}


# ------------------------------------------------------------------------------------------------ config, eval
def test_config_diff_lists_changed_added_and_removed_settings():
    a = {"optim": {"lr": 1e-5, "betas": [0.9, 0.99]}, "seed": 0, "only_a": 1}
    b = {"optim": {"lr": 2e-5, "betas": [0.9, 0.99]}, "seed": 0, "only_b": {"x": 2}}
    assert config_diff(a, b) == [{"key": "only_a", "a": 1, "b": None}, {"key": "only_b.x", "a": None, "b": 2},
                                 {"key": "optim.lr", "a": 1e-5, "b": 2e-5}]


def test_eval_disagreements_match_problems_by_id_on_greedy_score_or_sample_rate():
    model = [{"id": "p1", "prompt": "1+1", "answer": "2", "greedy": {"completion": "2", "score": 1.0}},
             {"id": "p2", "prompt": "2+2", "answer": "4", "greedy": {"completion": "4", "score": 1.0}},
             {"id": "p3", "prompt": "3+3", "answer": "6", "samples": ["6", "5"], "scores": [1.0, 0.0]},
             {"id": "only-model", "greedy": {"score": 1.0}}]
    compare = [{"id": "p2", "greedy": {"completion": "5", "score": 0.0}},
               {"id": "p1", "greedy": {"completion": "2", "score": 1.0}},
               {"id": "p3", "samples": ["5", "5"], "scores": [0.0, 0.0]}]
    found = disagreements(model, compare)
    assert [(d["id"], d["model"]["score"], d["compare"]["score"])
            for d in found] == [("p2", 1.0, 0.0), ("p3", 0.5, 0.0)]
    assert found[0]["compare"]["completion"] == "5" and found[1]["model"]["completion"] == "6"


# ------------------------------------------------------------------------------------------------ app, export
@pytest.fixture
def two_seeds(tmp_path):
    runs = []
    for seed in (0, 1):
        rows = [{"step": s, "time": 100.0 + s, "reward/total": 0.1 * s + seed, "train/entropy": 1.0} for s in (1, 2, 3)]
        runs.append(write_run(tmp_path / "sweep" / str(seed), rows, overrides=[f"seed={seed}", "optim.lr=1e-5"],
                              samples={2: step_records(), 3: step_records()[:2]}))
    return tmp_path / "sweep"


def test_library_answers_the_routes_the_page_asks(two_seeds):
    write_run(two_seeds / "other", [{"step": 1, "reward/total": 0.0}], overrides=["seed=0", "optim.lr=3e-5"])
    library = Library([two_seeds])
    runs = library.runs_payload()
    assert [r["name"] for r in runs["runs"]] == ["sweep/0", "sweep/1", "other"]
    assert runs["runs"][0]["samples_per_step"] == 4 and runs["groups"] == [  # a single seed has no band
        {"id": "g0", "label": "optim.lr=1e-5: mean of 2 seeds", "runs": ["r0", "r1"]}]
    metrics = library.metrics_payload("r1", 1)
    assert metrics["step"] == [2, 3] and metrics["metrics"]["reward/total"] == pytest.approx([1.2, 1.3])
    assert [g["title"] for g in metrics["groups"]] == ["Reward and its components", "Entropy"]
    assert library.bands_payload("g0")["bands"]["reward/total"]["mean"] == pytest.approx([0.6, 0.7, 0.8])
    assert library.steps_payload("r0") == {"steps": [2, 3]}
    assert [g["prompt"] for g in library.samples_payload("r0", 2)["groups"]] == ["p1", "p2", "p3"]
    followed = library.follow_payload("r0", "p1")["steps"]
    assert [(f["step"], f["group"]["kind"]) for f in followed] == [(2, "right"), (3, "right")]
    (two_seeds / "0" / "env.json").write_text(json.dumps({"command": ["rlx-train", "seed=0", "optim.lr=1e-5"]}))
    config = library.config_payload("r0")
    assert config["command"] == "rlx train seed=0 optim.lr=1e-5" and "prompts_per_step: 2" in config["text"]
    assert config["overrides"] == ["seed=0", "optim.lr=1e-5"]
    with pytest.raises(KeyError):
        library.run("r9")


def test_a_run_still_being_written_grows_on_the_next_request(two_seeds):
    library = Library([two_seeds])
    assert json.loads(library.metrics_json("r0", 0))["step"] == [1, 2, 3]  # kept encoded until the run grows
    with (two_seeds / "0" / "metrics.jsonl").open("a") as handle:
        handle.write('{"step": 4, "reward/total": 0.4}\n{"step": 5, "rew')
    grown = library.metrics_payload("r0", 3)
    assert grown["step"] == [4] and grown["rows"] == 4 and grown["pending"]
    assert json.loads(library.metrics_json("r0", 0))["step"] == [1, 2, 3, 4]
    (two_seeds / "2").mkdir()  # a new trial of the sweep appears
    write_run(two_seeds / "2" / "inner", [{"step": 1}])
    assert [r["name"] for r in library.runs_payload()["runs"]] == ["sweep/0", "sweep/1", "inner"]


def test_export_writes_the_page_and_every_answer_it_needs(two_seeds, tmp_path):
    library = Library([two_seeds])
    page = export(library, tmp_path / "page")
    html = page.read_text()
    assert '<script src="data.js"></script>' in html and "static/vendor/uplot/uPlot.iife.min.js" in html
    assert (tmp_path / "page" / "static" / "vendor" / "uplot" / "LICENSE").is_file()
    text = (tmp_path / "page" / "data.js").read_text()
    data = json.loads(text[len("window.RLX_EXPORT = "):-2])
    assert {"/api/runs", "/api/metrics/r0?since=0", "/api/samples/r1/3", "/api/bands/g0", "/api/diff/r0/r1",
            "/api/config/r1"} <= set(data)
    assert data["/api/metrics/r0?since=0"]["metrics"]["reward/total"] == pytest.approx([0.1, 0.2, 0.3])
    assert data["/api/diff/r0/r1"]["diff"] == []  # the hand-made configs are equal


def test_the_server_binds_127_0_0_1_on_a_port_from_the_os_and_serves_page_and_routes(two_seeds):
    import uvicorn

    sock = free_socket(0)
    host, port = sock.getsockname()
    assert host == "127.0.0.1" and port > 0
    server = uvicorn.Server(uvicorn.Config(create_app(Library([two_seeds])), log_level="error"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(100):
            if server.started:
                break
            time.sleep(0.05)
        page = urllib.request.urlopen(base + "/").read().decode()
        assert "static/app.js" in page
        assert b"uPlot" in urllib.request.urlopen(base + "/static/vendor/uplot/uPlot.iife.min.js").read()[:2000]
        metrics = json.load(urllib.request.urlopen(base + "/api/metrics/r0?since=2"))
        assert metrics["step"] == [3]
        follow = json.load(urllib.request.urlopen(base + "/api/follow/r1?prompt=p3"))
        assert [f["step"] for f in follow["steps"]] == [2]
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(base + "/api/metrics/r7")
        assert missing.value.code == 404 and "no run or group r7" in missing.value.read().decode()
    finally:
        server.should_exit = True
        thread.join(timeout=10)


# ------------------------------------------------------------------------------------------------ the run directory
def test_a_samples_file_holds_each_completions_group_verdict_length_and_components(tmp_path, rlx_cli):
    """What the sample browser shows, written by rlx train (rlx/rollout/single_turn.py: single_turn_records)."""
    result = rlx_cli(["train", "steps=1", "prompts_per_step=3", "rollout.samples_per_prompt=4", "log.samples_every=1",
                      "eval.size=4", "rollout.max_new_tokens=12", "save.final=false", "save.plot=false",
                      "checkpoint.at_end=false", "hardware.num_threads=1"], tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = (tmp_path / "outputs" / "train").iterdir()
    records = [json.loads(line) for line in (run_dir / "samples" / "step_000001.jsonl").read_text().splitlines()]
    assert len(records) == 12
    assert [r["group"] for r in records] == [0] * 4 + [1] * 4 + [2] * 4  # G adjacent rows, one prompt
    assert all(len({r["prompt"] for r in records if r["group"] == g}) == 1 for g in (0, 1, 2))
    for r in records:
        assert set(r["components"]) == {"task", "format"}
        # reward/total = 1.0 x task + 0.1 x format (conf/reward/exact_match.yaml weights, as config.yaml says)
        assert r["reward"] == pytest.approx(r["components"]["task"] + 0.1 * r["components"]["format"], abs=1e-6)
        assert r["correct"] == (r["components"]["task"] == 1.0)  # the accuracy component (reward.accuracy: task)
        assert 1 <= r["length"] <= 12 and isinstance(r["truncated"], bool)
        assert not r["truncated"] or r["length"] == 12  # cut at the budget: every token of it used


def test_every_health_flag_links_to_a_section_of_docs_view_md():
    from tests.conftest import REPO

    headings = {line[4:].strip().lower().replace(",", "").replace(" ", "-")
                for line in (REPO / "docs" / "view.md").read_text().splitlines() if line.startswith("### ")}
    assert {anchor for anchor, _ in health.FLAGS.values()} <= headings
    assert len(health.FLAGS) == 7
