"""rlx view in a real browser: headless Chromium (the system's package) driven by playwright's Python package
(`pip install -e '.[view-test]'`; `make test-view` installs both). The curves draw the run's own values, the
sample browser filters, searches and follows a prompt, a run that trains adds points while the page is open, the
export opens from disk, and damaged input is named on the page. Screenshots go to RLX_VIEW_SCREENSHOTS (a folder)
when set, else to the test's tmp folder. ~1 min on 2 cores."""

import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, run_rlx

pytestmark = pytest.mark.slow

CHROMIUM = next((shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome")
                 if shutil.which(name)), None)
try:
    import playwright.sync_api as playwright_api
except ImportError:
    playwright_api = None
if CHROMIUM is None or playwright_api is None:
    pytest.skip("needs chromium (apt-get install -y chromium) and playwright (pip install -e '.[view-test]'); "
                "`make test-view` installs both", allow_module_level=True)

# 8 training prompts, 4 a step: every prompt comes back every other step (one to follow across the steps)
TRAIN = ["data.train_size=8", "data.eval_size=8", "prompts_per_step=4", "rollout.samples_per_prompt=4",
         "log.samples_every=1", "log.num_samples=16",
         "eval.size=8", "eval.every=2", "rollout.max_new_tokens=16", "hardware.num_threads=1", "checkpoint.every=0",
         "checkpoint.at_end=false", "save.final=false", "save.plot=false"]


def shots(tmp_path) -> Path:
    folder = Path(os.environ.get("RLX_VIEW_SCREENSHOTS", tmp_path / "shots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def rows_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def records_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def flat(points) -> list[float]:
    return [value for point in points for value in point]


def drawn_points(page, metric: str, label: str) -> list[tuple[float, float]]:
    """The (x, y) points uPlot holds for the line `label` of the chart of `metric` (what it draws)."""
    return [tuple(p) for p in page.evaluate(
        """([metric, label]) => { const c = window.rlxView.charts[metric]; if (!c) return [];
            const i = c.series.indexOf(label) + 1; const d = c.plot.data; if (i === 0) return [];
            return d[0].map((x, j) => [x, d[i][j]]).filter((p) => p[1] !== null); }""", [metric, label])]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("view")
    result = run_rlx(["train", "steps=4", *TRAIN, f"hydra.run.dir={root / 'outputs' / 'done'}"], root, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    damaged = root / "damaged"  # a run damaged in each way the page must name and survive
    (damaged / "samples").mkdir(parents=True)
    (damaged / "metrics.jsonl").write_text('{"step": 1, "reward/total": 0.5}\n{oops\n{"step": 2, "reward/total": 0.6}\n'
                                           '{"step": 3, "rew')
    (damaged / "samples" / "step_000001.jsonl").write_bytes(b'{"prompt": "caf\xe9", '
                                                            b'"completion": "x", "reward": 1.0}\n')
    (root / "not_a_run").mkdir()
    for seed, values in enumerate([(0.1, 0.2, 0.3, 0.4), (0.3, 0.2, 0.5, 0.6)]):  # two seeds of one configuration
        folder = root / "seeds" / str(seed)
        folder.mkdir(parents=True)
        (folder / "overrides.yaml").write_text(f"- seed={seed}\n- optim.lr=0.001\n")
        (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward/total": v}) + "\n"
                                                      for s, v in enumerate(values, 1)))
    return root


@pytest.fixture(scope="module")
def browser():
    with playwright_api.sync_playwright() as driver:
        chromium = driver.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()


@pytest.fixture
def served(trained):
    """The page over <root>/outputs (the finished run, later the live one), the damaged run and a folder without
    runs."""
    import uvicorn

    from rlx.view.app import Library, create_app, free_socket

    sock = free_socket(0)
    server = uvicorn.Server(uvicorn.Config(create_app(Library([trained / "outputs", trained / "damaged",
                                                               trained / "not_a_run", trained / "seeds"])),
                                           log_level="error"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.time() + 10
    while not server.started and time.time() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/"
    server.should_exit = True
    thread.join(timeout=10)


def open_page(browser, url):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(url)
    page.wait_for_function("document.body.dataset.ready === '1'", timeout=20000)
    return page, errors


def test_curves_samples_follow_live_run_and_damaged_input(trained, served, browser, tmp_path):
    run_dir = trained / "outputs" / "done"
    page, errors = open_page(browser, served)
    # curves: the drawn reward/total line of the run is its metrics.jsonl values, step by step
    expected = [(r["step"], r["reward/total"]) for r in rows_of(run_dir) if "reward/total" in r]
    assert len(expected) == 4
    assert flat(drawn_points(page, "reward/total", "done")) == pytest.approx(flat(expected))
    eval_points = [(r["step"], r["eval/accuracy"]) for r in rows_of(run_dir) if "eval/accuracy" in r]
    assert flat(drawn_points(page, "eval/accuracy", "done")) == pytest.approx(flat(eval_points))
    # two seeds: drawn as their mean with the t band of the mean (t(0.975, 1) = 12.706, n = 2)
    label = page.evaluate("window.rlxView.groups[0].label")
    assert label == "mean of 2 seeds" or label.endswith(": mean of 2 seeds")
    assert flat(drawn_points(page, "reward/total", label)) == pytest.approx([1, 0.2, 2, 0.2, 3, 0.4, 4, 0.5])
    half = [12.706 * abs(a - b) / math.sqrt(2) / math.sqrt(2)
            for a, b in [(0.1, 0.3), (0.2, 0.2), (0.3, 0.5), (0.4, 0.6)]]
    high = [y for _, y in drawn_points(page, "reward/total", "band high")]
    assert high == pytest.approx([m + h for m, h in zip([0.2, 0.2, 0.4, 0.5], half)], rel=1e-4)
    page.uncheck("#bands")  # each seed on its own
    assert flat(drawn_points(page, "reward/total", "seeds/1")) == pytest.approx([1, 0.3, 2, 0.2, 3, 0.5, 4, 0.6])
    page.check("#log-scale")
    assert page.evaluate("window.rlxView.charts['reward/total'].plot.scales.y.distr") == 3
    page.uncheck("#log-scale")
    page.check("#bands")
    page.screenshot(path=str(shots(tmp_path) / "view-curves.png"))
    # damaged input is named where it applies and the rest keeps working
    assert "not_a_run is not a run" in page.inner_text("#notes")
    page.click("#tabs button[data-tab=health]")
    assert "metrics.jsonl line 2 is not JSON" in page.inner_text("#health")

    # the sample browser: one step's prompts, the filters, the search, one prompt followed across the steps
    page.click("#tabs button[data-tab=samples]")
    run_id = page.evaluate("window.rlxView.runs.find((r) => r.name === 'done').id")
    page.select_option("#sample-run", run_id)
    page.wait_for_selector(".prompt-group")
    steps = sorted(int(p.stem[5:]) for p in (run_dir / "samples").glob("step_*.jsonl"))
    page.select_option("#sample-step", str(steps[-1]))
    page.wait_for_function(f"window.rlxView.samples && window.rlxView.samples.step === {steps[-1]}")
    records = records_of(run_dir / "samples" / f"step_{steps[-1]:06d}.jsonl")
    by_group: dict[int, list[dict]] = {}
    for record in records:
        by_group.setdefault(record["group"], []).append(record)
    assert page.locator(".prompt-group").count() == len(by_group)
    wrong = sum(not any(r["correct"] for r in group) for group in by_group.values())
    page.select_option("#sample-filter", "wrong")
    assert page.locator(".prompt-group").count() == wrong
    assert all(kind == "wrong"
               for kind in page.locator(".prompt-group").evaluate_all("els => els.map(e => e.dataset.kind)"))
    page.select_option("#sample-filter", "all")
    needle = records[0]["prompt"].split("problem: ")[1].split("=")[0]  # the arithmetic of the first prompt
    page.fill("#sample-search", needle)
    assert page.locator(".prompt-group").count() == len({r["group"] for r in records if needle in r["prompt"]})
    page.screenshot(path=str(shots(tmp_path) / "view-samples.png"), full_page=True)
    page.locator(".prompt-group button.follow").first.click()
    page.wait_for_selector("#follow table.follow-summary")
    followed = records[0]["prompt"]
    expected_rows = []  # one row per group holding the prompt, file by file
    for step in steps:
        groups = {r["group"] for r in records_of(run_dir / "samples" / f"step_{step:06d}.jsonl") if r["prompt"]
                  == followed}
        expected_rows += [step] * len(groups)
    shown = page.locator("#follow tr[data-step]").evaluate_all("els => els.map(e => Number(e.dataset.step))")
    assert shown == expected_rows and steps[-1] in shown and len(set(shown)) >= 2
    page.screenshot(path=str(shots(tmp_path) / "view-follow.png"))
    # a non-UTF-8 samples file: said on the page, its text shown
    page.fill("#sample-search", "")
    page.select_option("#sample-run", page.evaluate("window.rlxView.runs.find((r) => r.name === 'damaged').id"))
    page.wait_for_selector("#sample-notes .note")
    assert "not UTF-8" in page.inner_text("#sample-notes") and "caf\ufffd" in page.inner_text("#samples")

    # a live run: it appears under outputs/ and its curve grows while the page is open
    page.click("#tabs button[data-tab=curves]")
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    live = subprocess.Popen([sys.executable, "-m", "rlx", "train", "steps=40", *TRAIN, "eval.every=0",
                             f"hydra.run.dir={trained / 'outputs' / 'live'}"], cwd=trained, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        def live_points_at_least(count: int) -> None:
            page.wait_for_function("(() => { const c = window.rlxView.charts['reward/total']; const i = c ? "
                                   "c.series.indexOf('live') : -1; return i >= 0 && c.plot.data[i + 1].filter((v) => "
                                   f"v !== null).length >= {count}; }})()",
                                   timeout=60000)

        live_points_at_least(2)  # the run appeared under outputs/ and its first rows are drawn
        first = len(drawn_points(page, "reward/total", "live"))
        live_points_at_least(first + 3)  # and more while it trains
        assert live.poll() is None or live.returncode == 0
        grown = drawn_points(page, "reward/total", "live")
        assert len(grown) >= first + 3
        logged = [(r["step"], r["reward/total"]) for r in rows_of(trained / "outputs" / "live") if "reward/total" in r]
        assert flat(grown) == pytest.approx(flat(logged[:len(grown)]))  # the points drawn are the rows written so far
        page.screenshot(path=str(shots(tmp_path) / "view-live.png"))
    finally:
        live.kill()
        live.wait(timeout=30)
    assert errors == []


def test_export_opens_from_disk(trained, browser, tmp_path):
    run_dir = trained / "outputs" / "done"
    out = tmp_path / "page"
    result = run_rlx(["view", str(run_dir), "--export", str(out)], tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    page, errors = open_page(browser, (out / "index.html").as_uri())
    expected = [(r["step"], r["reward/total"]) for r in rows_of(run_dir) if "reward/total" in r]
    assert flat(drawn_points(page, "reward/total", "done")) == pytest.approx(flat(expected))
    assert "exported page" in page.inner_text("#status")
    # x in samples drawn (prompts_per_step 4 x samples_per_prompt 4 per step), then smoothing (debiased EMA)
    page.select_option("#x-axis", "samples")
    assert [x for x, _ in drawn_points(page, "reward/total", "done")] == [16 * step for step, _ in expected]
    page.select_option("#x-axis", "step")
    page.locator("#smoothing").fill("0.5")
    smoothed, last = [], 0.0
    for count, (_, value) in enumerate(expected, 1):
        last = 0.5 * last + 0.5 * value
        smoothed.append(last / (1 - 0.5 ** count))
    assert [y for _, y in drawn_points(page, "reward/total", "done")] == pytest.approx(smoothed)
    page.click("#tabs button[data-tab=samples]")
    page.wait_for_selector(".prompt-group")
    page.locator(".prompt-group button.follow").first.click()  # computed in the page from the exported samples
    page.wait_for_selector("#follow tr[data-step]")
    page.click("#tabs button[data-tab=config]")
    assert page.inner_text("#config .command").startswith("rlx train steps=4 ")
    page.screenshot(path=str(shots(tmp_path) / "view-export.png"))
    assert errors == []
