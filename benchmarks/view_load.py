"""How fast `rlx view` loads a long run: 10,000 steps of metrics and 1,000 samples files (issue 51: under 2 s).

    python benchmarks/view_load.py [--steps 10000] [--sample-files 1000] [--browser]

Writes a synthetic run (the metric names of a real GRPO run, 16 completions per samples file, 4 prompts of 4),
then times, cold (a fresh server each round, median of --rounds):
  - each route the page asks on opening it (the runs, the whole metrics.jsonl, the samples steps, one step's
    samples) and following one prompt across every samples file, JSON-encoded as the server sends them;
  - with --browser (needs chromium and playwright, `make test-view` installs both): headless Chromium from
    navigation to the first curves drawn, and to one step of samples shown.
Prints a table and writes benchmarks/results/view_load.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

METRICS = ("completions/max_length", "completions/mean_length", "completions/truncated_frac", "perf/generation_time_s",
           "perf/logprob_time_s", "perf/optimizer_time_s", "perf/step_time_s", "perf/tokens_per_s",
           "perf/update_time_s", "reward/accuracy", "reward/errors", "reward/format", "reward/format_std",
           "reward/task", "reward/task_std", "reward/total", "reward/total_std", "rollout/logprob_gap_max",
           "rollout/logprob_gap_mean", "train/advantage_max", "train/advantage_mean", "train/advantage_std",
           "train/approx_kl", "train/clip_frac", "train/clip_frac_high", "train/clip_frac_low", "train/entropy",
           "train/frac_zero_std_groups", "train/grad_norm", "train/kl_ref", "train/loss", "train/lr",
           "train/prompts_drawn", "train/sample_rounds", "train/update_skipped")
EVAL_METRICS = ("eval/accuracy", "eval/format", "eval/mean_length", "eval/reward", "eval/task", "eval/truncated_frac")


def write_run(run_dir: Path, steps: int, sample_files: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text("prompts_per_step: 4\nrollout:\n  samples_per_prompt: 4\n  max_new_tokens: "
                                         "64\n  max_staleness: 0\n")
    (run_dir / "overrides.yaml").write_text(f"- steps={steps}\n")
    level = {name: rng.random() for name in METRICS}
    with (run_dir / "metrics.jsonl").open("w") as handle:
        for step in range(1, steps + 1):
            for name in METRICS:
                level[name] = max(1e-4, level[name] + rng.gauss(0, 0.01))
            row = {"step": step, "time": 1.8e9 + step * 0.5, **level}
            if step % 50 == 0:
                row.update({name: rng.random() for name in EVAL_METRICS})
            handle.write(json.dumps(row) + "\n")
    (run_dir / "samples").mkdir()
    every = max(1, steps // sample_files)
    prompts = [f"<|im_start|>user\nState the final answer: {a} + {b} "
               "=<|im_end|>\n" for a in range(10) for b in range(10)]
    for index in range(sample_files):
        step = (index + 1) * every
        records = []
        for group in range(4):
            prompt = prompts[(index * 4 + group) % len(prompts)]
            for _ in range(4):
                correct = rng.random() < 0.5
                records.append({"prompt": prompt, "completion": f"<answer>{rng.randint(0, 18)}</answer>",
                                "reward": float(correct) + 0.1, "advantage": rng.gauss(0, 1), "answer": "9",
                                "group": group, "length": rng.randint(5, 64), "truncated": rng.random() < 0.05,
                                "correct": correct, "components": {"task": float(correct), "format": 1.0}})
        (run_dir / "samples" / f"step_{step:06d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def time_routes(run_dir: Path) -> dict[str, float]:
    """Seconds of each route on a fresh Library, JSON encoding included (what the server sends)."""
    from rlx.view.app import Library

    times = {}

    def timed(name, fn):
        start = time.perf_counter()
        payload = fn()
        json.dumps(payload, allow_nan=False)
        times[name] = time.perf_counter() - start
        return payload

    library = timed("runs", lambda: Library([run_dir]).runs_payload())
    library = Library([run_dir])
    metrics = timed("metrics", lambda: library.metrics_payload("r0", 0))
    steps = timed("samples steps", lambda: library.steps_payload("r0"))["steps"]
    group = timed("one step's samples", lambda: library.samples_payload("r0", steps[-1]))["groups"][0]
    timed("follow a prompt (every file)", lambda: library.follow_payload("r0", group["prompt"]))
    times["opening the page (server)"] = times["runs"] + times["metrics"] + times["samples steps"]
    assert metrics["rows"] > 0
    return times


def time_browser(run_dir: Path) -> dict[str, float]:
    import uvicorn
    from playwright.sync_api import sync_playwright

    from rlx.view.app import Library, create_app, free_socket

    chromium = next(shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n))
    sock = free_socket(0)
    start = time.perf_counter()
    library = Library([run_dir])
    library.warm()  # what `rlx view` does before it prints the URL
    started = time.perf_counter() - start
    server = uvicorn.Server(uvicorn.Config(create_app(library), log_level="error"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    try:
        with sync_playwright() as driver:
            browser = driver.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            start = time.perf_counter()
            page.goto(f"http://127.0.0.1:{sock.getsockname()[1]}/")
            page.wait_for_function("document.body.dataset.ready === '1'", timeout=60000)
            loaded = time.perf_counter() - start
            charts = page.evaluate("Object.keys(window.rlxView.charts).length")
            print("page timings (ms since navigation):", page.evaluate("window.rlxView.timings"))
            start = time.perf_counter()
            page.click("#tabs button[data-tab=samples]")
            page.wait_for_selector(".prompt-group", timeout=60000)
            samples = time.perf_counter() - start
            browser.close()
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    return {"rlx view reads the run before printing the URL": started, "page ready, curves drawn (browser)": loaded,
            "samples tab shown (browser)": samples, "charts": charts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--sample-files", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--browser", action="store_true", help="also time the page in headless Chromium")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "view_load.json")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "long_run"
        write_run(run_dir, args.steps, args.sample_files)
        size = (run_dir / "metrics.jsonl").stat().st_size
        rounds = [time_routes(run_dir) for _ in range(args.rounds)]
        browser = [time_browser(run_dir) for _ in range(args.rounds)] if args.browser else []
    medians = {name: statistics.median(r[name] for r in rounds) for name in rounds[0]}
    rows = [[name, round(seconds, 3)] for name, seconds in medians.items()]
    charts = None
    if browser:
        charts = browser[0].pop("charts")
        for entry in browser:
            entry.pop("charts", None)
        rows += [[name, round(statistics.median(b[name] for b in browser), 3)] for name in browser[0]]
    for name, seconds in rows:
        print(f"{name:40s} {seconds:7.3f} s")
    command = "python benchmarks/view_load.py" + (" --browser" if args.browser else "")
    result = {
        "title": "rlx view on a long run",
        "section": "Development",
        "order": 90,
        "description": (f"A synthetic run of {args.steps:,} steps ({len(METRICS) + len(EVAL_METRICS)} metrics, "
                        f"metrics.jsonl {size / 1e6:.1f} MB) and {args.sample_files:,} samples files of 16 "
                        "completions: seconds to answer each route cold (JSON encoding included), median of "
                        f"{args.rounds} rounds"
                        + (f"; in headless Chromium, the page with {charts} curves drawn (the first four metric groups "
                           f"open)" if browser else "") + ". Issue 51 asks for under 2 s."),
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"the project's {os.cpu_count()}-core development VM ({platform.machine()}, no GPU)",
        "load": f"shared CPU, 1-minute load average {load:.1f} at the start (other engineers' jobs)",
        "command": command,
        "columns": ["what", "seconds"],
        "rows": rows,
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
