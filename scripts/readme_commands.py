"""Run every command of the ```bash blocks of README.md and docs/**/*.md on a fresh clone; report which fail.

    python scripts/readme_commands.py                 # every runnable command, trainings shortened (~8 min on 2 cores)
    python scripts/readme_commands.py --quick         # only commands that do not train (seconds; run by `make test`)
    python scripts/readme_commands.py --list          # how each command would be run, without running it

Besides the ```bash blocks, every transcript in another block (a `$ rlx ...` line followed by the `error: ...`
line it prints, `...` matching any text) is run and its error line compared; transcripts never train, so
--quick runs them too. A block right after a line `<!-- docs-check: skip (why) -->` is left out.

The clone is `git clone` of this checkout's HEAD into a temporary folder; each `rlx ...` runs there as
`python -m rlx ...` with the clone first on PYTHONPATH, from an empty working folder, offline. Commands
that train are shortened (2 steps, tiny batches, 8 new tokens; sweeps and prompt counts cut down).
Placeholders (`<run>`, `<sweep>`, `<dir>`, `DIR`, `<..._rm>`, `run_a run_b`) become folders that earlier
commands produced; the small files the README assumes (`my.jsonl`, `gsm8k_test.jsonl`) are written first.
Commands that need a GPU, the network, a hub model or another package are listed as skipped, with why.
Exit code 1 when a command failed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SHORT_TRAIN = {"steps": "2", "prompts_per_step": "2", "rollout.samples_per_prompt": "2", "eval.size": "4",
               "eval.every": "2", "rollout.max_new_tokens": "8", "log.samples_every": "0", "save.plot": "false",
               "hardware.num_threads": "1", "checkpoint.every": "1", "data.eval_size": "8"}
# preference, reward-model and SFT runs (policy-gradient has no such key)
SHORT_BATCH = {"algorithm.batch_size": "4", "data.pairs.eval_size": "4"}
# data.pairs.eval_size only exists with data=prefs*: added when the command names such data
BATCHED = re.compile(r"algorithm=(dpo|simpo|ipo|orpo|cdpo|hinge|robust_dpo|ln_dpo|sft|reward_model)\b"
                     r"|(dpo|simpo|sft)\w*$")
SHORT_EVAL = {"limit": "3", "sampling.n": "2", "plot": "false", "hardware.num_threads": "1"}
SHORT_PREFS = {"prompts": "12", "samples_per_prompt": "4"}
# why a command cannot run on a CPU-only, offline machine (first match wins)
SKIPS = [
    (r"hardware=(gpu|multinode)|hardware=(ddp|fsdp)(?!.*hardware\.cpu=true)|rollout=vllm", "needs GPUs"),
    (r"model=(qwen|llama)|model\.path=(Qwen|meta-llama)/|data=prefs_hub|benchmark=\[?gsm8k(?!.*load\.path)|math500",
     "needs a hub download"),
    (r"rollout=server", "needs vLLM (the .venv-vllm environment: make test-vllm runs rollout=server)"),
    (r"env\.target=my_agent\.",
     "the user's own agent program (examples/ has runnable ones, tests/test_gateway_harness.py runs them)"),
    (r"^(pip|make bench|python benchmarks)", "installs packages or benchmarks for an hour"),
    (r"^make (train|test|reproduce)", "make target (make test runs the suite; rlx commands cover the rest)"),
    (r"^pytest", "a test command (the suite is run separately)"),
    (r"^rlx view(?!.*--export)",
     "serves a page until Ctrl-C (the --export form runs; tests/test_view_browser.py drives the server)"),
    (r"model\.path=/local/dir|my\.parquet|resume=/shared/", "a placeholder the user replaces with their own files"),
]
if importlib.util.find_spec("deepspeed") is None:
    SKIPS.insert(0, (r"hardware=deepspeed", "needs the deepspeed extra (pip install 'rlx[deepspeed]')"))
QUICK = re.compile(r"^rlx (--help|--version|recipes( show \S+)?$|train --help|train --cfg job|\w+ --help)")


SKIP_MARK = "<!-- docs-check: skip"
BLOCK = re.compile(r"^(?P<skip><!-- docs-check: skip[^\n]*-->\n)?```(?P<lang>[\w-]*)\n(?P<body>.*?)^```",
                   re.DOTALL | re.MULTILINE)


def doc_files(repo: Path = REPO) -> list[Path]:
    """README.md, then every Markdown page of docs/ (sorted): the files whose commands are checked."""
    return [repo / "README.md", *sorted((repo / "docs").rglob("*.md"))]


def code_blocks(page: Path) -> list[tuple[str, str]]:
    """(language, text) of every fenced code block of a page, except those marked docs-check: skip."""
    return [(m["lang"], m["body"]) for m in BLOCK.finditer(page.read_text()) if not m["skip"]]


def transcripts(page: Path) -> list[tuple[str, str]]:
    """(command, expected error line) of every `$ rlx ...` line followed by an `error:` line, outside bash blocks."""
    found = []
    for lang, body in code_blocks(page):
        if lang == "bash":
            continue
        lines = body.splitlines()
        for i, line in enumerate(lines):
            if line.startswith("$ rlx ") and i + 1 < len(lines) and lines[i + 1].startswith("error: "):
                found.append((line[2:].strip(), lines[i + 1].strip()))
    return found


def error_matches(expected: str, stderr: str) -> bool:
    """Does a line of stderr equal the expected error line, `...` in it matching any text?"""
    pattern = ".*?".join(re.escape(part) for part in expected.split("..."))
    return any(re.fullmatch(pattern, line.strip()) for line in stderr.splitlines())


def command_lines(block: str) -> list[str]:
    """The lines of a code block as commands: continuation lines joined, comments and empty lines dropped."""
    commands, pending = [], ""
    for raw in block.splitlines():
        line = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not line.strip():
            continue
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        commands.append((pending + line.strip()).strip())
        pending = ""
    return commands


def readme_commands(readme: Path) -> list[str]:
    """Command lines of the ```bash blocks, continuation lines joined, comments dropped."""
    return [command for lang, body in code_blocks(readme) if lang == "bash" for command in command_lines(body)]


def _with(args: list[str], settings: dict) -> list[str]:
    """args with these key=value settings replacing any given for the same keys."""
    kept = [a for a in args if a.split("=", 1)[0].lstrip("+~") not in settings]
    return kept + [f"{k}={v}" for k, v in settings.items()]


class Runner:
    def __init__(self, clone: Path, work: Path, timeout: int):
        self.clone, self.work, self.timeout = clone, work, timeout
        self.env = dict(os.environ, PYTHONPATH=str(clone), RLX_OUTPUTS=str(work / "outputs"), HF_HUB_OFFLINE="1",
                        HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        self.env.pop("VIRTUAL_ENV", None)

    def newest(self, kind: str, pattern: str = "*") -> Path | None:
        folder = self.work / "outputs" / kind
        found = sorted(folder.glob(pattern), key=lambda p: p.stat().st_mtime) if folder.is_dir() else []
        return found[-1] if found else None

    def substitute(self, command: str) -> tuple[str | None, str]:
        """Placeholders -> produced folders; returns (command or None, reason when None)."""
        runs = sorted((self.work / "outputs" / "train").glob("*"), key=lambda p: p.stat().st_mtime) \
            if (self.work / "outputs" / "train").is_dir() else []
        runs = [r for r in runs if (r / "final").is_dir()]
        # <run> stands for a plain run: prefer one whose checkpoints hold a model (not FSDP/DeepSpeed shards)
        runs = [r for r in runs if not any((r / "checkpoints").glob("step_*/*.distcp"))
                and not any((r / "checkpoints").glob("step_*/pytorch_model_fsdp_0"))] or runs
        sweep, evals = self.newest("multirun"), self.newest("eval")
        rm = next((r for r in reversed(runs) if r.name.endswith("_rm")), None)
        table = {"outputs/train/<run>": runs[-1] if runs else None, "outputs/train/<a>": runs[-1] if runs else None,
                 "outputs/train/<b>": runs[-2] if len(runs) > 1 else None, "outputs/train/<..._rm>": rm,
                 "outputs/multirun/<sweep>": sweep, "outputs/eval/<dir>": evals,
                 "outputs/train/run_a": runs[-1] if runs else None,
                 "outputs/train/run_b": runs[-2] if len(runs) > 1 else None,
                 "outputs/train/2026-11-22_10-31-07.123456_grpo": runs[-1] if runs else None}
        for placeholder, folder in table.items():
            if placeholder in command:
                if folder is None:
                    return None, f"needs {placeholder} from an earlier command"
                command = command.replace(placeholder, str(folder))
        if re.search(r"\bDIR\b", command):
            if sweep is None:
                return None, "needs a sweep folder from an earlier command"
            command = re.sub(r"\bDIR\b", str(sweep), command)
        command = command.replace(" ...", "")
        if "--compare c2 c1" in command:
            return None, "names configurations c1, c2 of the user's own sweep"
        return command, ""

    def shorten(self, args: list[str]) -> list[str]:
        sub = args[1] if len(args) > 1 else ""
        if sub == "train" and not any(a in ("--help", "--cfg", "-h") for a in args):
            batched = any(BATCHED.search(a) for a in args[2:])
            pairs = any(a.startswith("data=prefs") for a in args)
            extra = {k: v for k, v in SHORT_BATCH.items() if batched and (pairs or not k.startswith("data.pairs"))}
            args = _with(args, {**SHORT_TRAIN, **extra})
            args = [re.sub(r"^seed=([^,]+,[^,]+),.*", r"seed=\1", a) for a in args]  # two seeds are enough
            return args
        if sub == "eval" and "--help" not in args:
            return [a.replace("checkpoint=step_000100", "checkpoint=step_2") for a in _with(args, SHORT_EVAL)]
        if args[1:3] == ["data", "prefs"]:
            return _with(args, SHORT_PREFS)
        if sub == "sweep" and len(args) > 2 and args[2] != "retest":
            extra = {"hydra.sweeper.n_trials": "2", "hydra.sweeper.sampler.n_startup_trials": "1"} if "optuna" in args \
                else {"seed": "0", "optim.lr": "1e-4", "algorithm.kl_coef": "0.0,0.01"}
            return _with(args, {**SHORT_TRAIN, **extra})
        if sub == "sweep" and len(args) > 2:  # retest: one test seed
            return args + ["seeds=1000", *[f"{k}={v}" for k, v in SHORT_TRAIN.items()]]
        return args

    def run(self, command: str) -> tuple[str, float, str]:
        args = shlex.split(command)
        chained = " && " in command
        if chained:
            return "skip", 0.0, "a chained comparison of two longer runs"
        args = self.shorten(args)
        start = time.perf_counter()
        try:
            result = subprocess.run([sys.executable, "-m", "rlx", *args[1:]], cwd=self.work, env=self.env,
                                    capture_output=True, text=True, timeout=self.timeout)
        except subprocess.TimeoutExpired:
            return "FAIL", time.perf_counter() - start, f"timed out after {self.timeout} s"
        took = time.perf_counter() - start
        if result.returncode != 0:
            last = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
            return "FAIL", took, f"exit {result.returncode}: {last[:200]}"
        return "ok", took, " ".join(args[1:])[:160]


    def transcript(self, command: str, expected: str) -> tuple[str, float, str]:
        """Run a documented failing command as typed; ok when its stderr has the documented error line."""
        start = time.perf_counter()
        try:
            result = subprocess.run([sys.executable, "-m", "rlx", *shlex.split(command)[1:]], cwd=self.work,
                                    env=self.env, capture_output=True, text=True, timeout=self.timeout)
        except subprocess.TimeoutExpired:
            return "FAIL", time.perf_counter() - start, f"timed out after {self.timeout} s"
        took = time.perf_counter() - start
        if result.returncode == 0 or not error_matches(expected, result.stderr):
            last = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
            return "FAIL", took, f"exit {result.returncode}: printed {last[:200]!r}, the docs show {expected!r}"
        return "ok", took, expected


def prepare_files(work: Path) -> None:
    rows = [{"question": f"What is {a} + {b}?", "answer": str(a + b)} for a in range(8) for b in range(8)]
    (work / "my.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (work / "gsm8k_test.jsonl").write_text("".join(json.dumps({"question": r["question"],
                                                               "answer": f"#### {r['answer']}"})
                                                   + "\n" for r in rows[:8]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only the commands that do not train")
    parser.add_argument("--list", action="store_true", help="print the plan, run nothing")
    parser.add_argument("--repo", type=Path, default=REPO, help="the checkout to clone (default: this one)")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per command")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    opts = parser.parse_args(argv)

    commands = list(dict.fromkeys(c for page in doc_files(opts.repo) for c in readme_commands(page)))
    checks = list(dict.fromkeys(t for page in doc_files(opts.repo) for t in transcripts(page)))
    tmp = Path(tempfile.mkdtemp(prefix="rlx_readme_"))
    clone, work = tmp / "rlx", tmp / "work"
    subprocess.run(["git", "clone", "--quiet", str(opts.repo), str(clone)], check=True)
    work.mkdir()
    prepare_files(work)
    runner = Runner(clone, work, opts.timeout)
    results, deferred = [], []
    for command, expected in checks:  # transcripts first: they need no earlier output and never train
        if opts.list:
            results.append(("plan", 0.0, command, f"expects: {expected}"))
            continue
        status, took, detail = runner.transcript(command, expected)
        results.append((status, took, command, detail))
        print(f"{status:4} {took:6.1f}s  $ {command}" + ("\n            "
                                                         f"{detail}" if status == "FAIL" else ""), flush=True)
    for command in commands + [None]:
        if command is None:  # second pass: commands whose placeholders needed a later command's output
            if not deferred:
                break
            pending, deferred = deferred, []
            for late in pending:
                resolved, why = runner.substitute(late)
                if resolved is None:
                    results.append(("skip", 0.0, late, why))
                    continue
                status, took, detail = runner.run(resolved)
                results.append((status, took, late, detail))
                print(f"{status:4} {took:6.1f}s  {late}" + ("\n            "
                                                            f"{detail}" if status == "FAIL" else ""), flush=True)
            break
        reason = next((why for pattern, why in SKIPS if re.search(pattern, command)), None)
        if not command.startswith("rlx ") and reason is None:
            reason = "not an rlx command"
        if reason is None and opts.quick and not QUICK.match(command):
            reason = "trains (left out by --quick)"
        if reason is not None:
            results.append(("skip", 0.0, command, reason))
            continue
        resolved, why = runner.substitute(command)
        if resolved is None:
            if opts.list:
                results.append(("skip", 0.0, command, why))
            else:
                deferred.append(command)
            continue
        if opts.list:
            results.append(("plan", 0.0, command, " ".join(runner.shorten(shlex.split(resolved)))[:200]))
            continue
        status, took, detail = runner.run(resolved)
        results.append((status, took, command, detail))
        print(f"{status:4} {took:6.1f}s  {command}" + (f"\n            {detail}" if status == "FAIL" else ""),
              flush=True)
    failed = [r for r in results if r[0] == "FAIL"]
    print(f"\n{len(results)} docs commands: {sum(r[0] == 'ok' for r in results)} ok, {len(failed)} failed, "
          f"{sum(r[0] == 'skip' for r in results)} skipped")
    for status, _, command, detail in results:
        if status in ("skip", "plan"):
            print(f"  {status}: {command[:90]}  ({detail})")
    for _, _, command, detail in failed:
        print(f"  FAILED: {command}\n          {detail}")
    if not opts.keep:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    else:
        print(f"kept: {tmp}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
