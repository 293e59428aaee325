"""rlx outside its checkout: the wheel installs and runs from any directory; --version; a fast --help
that shows the config comments; an external multi-process launcher stops with one line."""

import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

import rlx
from tests.conftest import REPO, run_rlx

CLEAN_ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def test_version_flag_matches_package(tmp_path):
    result = run_rlx(["--version"], tmp_path, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"rlx {rlx.__version__}"
    assert rlx.__version__.count(".") == 2


def test_train_help_is_fast_shows_comments_and_only_train_groups(tmp_path):
    start = time.perf_counter()
    result = run_rlx(["train", "algorithm=dapo", "--help"], tmp_path, timeout=60)
    took = time.perf_counter() - start
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "# seeds python, numpy, torch and the data order" in text  # a comment of conf/train.yaml
    assert "== algorithm=dapo " in text and "== algorithm=grpo " in text  # the chosen option and the one it extends
    assert "clip_high" in text
    assert "\nbenchmark:" not in text  # a group of rlx eval, not of rlx train
    eval_help = run_rlx(["eval", "--help"], tmp_path, timeout=60).stdout
    assert "\nbenchmark:" in eval_help and "\nalgorithm:" not in eval_help
    assert took < 5, f"rlx train --help took {took:.1f}s"


def test_help_does_not_import_torch():
    code = ("import sys; from rlx.cli import main; main(['train', '--help']); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert result.returncode == 0, result.stderr[-2000:]


def test_rank_of_an_external_launcher_stops_with_one_line(tmp_path):
    # what `accelerate launch --num_processes 2 -m rlx train` gives each rank
    result = run_rlx(["train", "steps=1"], tmp_path, timeout=60,
                     env_extra={"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"})
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "hardware=ddp hardware.num_processes=2" in lines[0], result.stderr
    assert not (tmp_path / "outputs").exists()
    other_rank = run_rlx(["train", "steps=1"], tmp_path, timeout=60, env_extra={"WORLD_SIZE": "2", "RANK": "1"})
    assert other_rank.returncode == 2 and other_rank.stderr == ""


@pytest.mark.slow
def test_wheel_installs_and_runs_from_any_directory(tmp_path):
    """Build the wheel from a copy of the source, install it (no deps) into a fresh virtual environment
    that sees this environment's dependencies through a .pth file (not rlx itself), and run it from an
    empty directory without PYTHONPATH. ~1 min."""
    source = tmp_path / "src"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "outputs", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".ruff_cache",
        "benchmarks"))
    wheels = tmp_path / "wheels"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                            str(wheels), str(source)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = wheels.glob("rlx-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                                "--ignore-installed", "-q",
                                str(wheel)], capture_output=True, text=True, timeout=300, env=CLEAN_ENV)
    assert installed.returncode == 0, installed.stderr[-3000:]
    # then the dependencies (torch, transformers, ...) of this environment, after the venv's own site-packages
    # (written after the install, which must not see the editable rlx of this environment)
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = dict(CLEAN_ENV, RLX_OUTPUTS=str(work / "outputs"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    rlx_bin = str(venv / "bin" / "rlx")

    def run(*args, timeout=300):
        return subprocess.run([rlx_bin, *args], cwd=work, env=env, capture_output=True, text=True, timeout=timeout)

    where = subprocess.run([python, "-c", "import rlx; print(rlx.__file__)"], cwd=work, env=env, capture_output=True,
                           text=True, check=True).stdout.strip()
    assert where.startswith(str(venv)), f"rlx imported from {where}, not the installed wheel"
    version = run("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"rlx {rlx.__version__}", version.stderr
    helped = run("train", "--help")
    assert helped.returncode == 0 and "# seeds python" in helped.stdout, helped.stderr
    listed = run("recipes")
    assert listed.returncode == 0 and "grpo_tiny" in listed.stdout, listed.stderr
    trained = run("train", "steps=2", "prompts_per_step=2", "rollout.samples_per_prompt=4", "eval.size=4",
                  "eval.every=2", "rollout.max_new_tokens=16", "hardware.num_threads=1")
    assert trained.returncode == 0, trained.stderr[-3000:]
    (run_dir,) = (work / "outputs" / "train").iterdir()
    assert (run_dir / "final" / "model.safetensors").is_file() and (run_dir / "metrics.jsonl").is_file()
    page = run("view", str(run_dir), "--export", str(work / "page"))  # the page's files ship in the wheel
    assert page.returncode == 0, page.stderr[-2000:]
    assert ((work / "page" / "static" / "vendor" / "uplot" / "LICENSE").is_file()
            and (work / "page" / "data.js").is_file())
    recipe = run("train", "grpo_tiny", "--cfg", "job")
    assert recipe.returncode == 0 and "grpo" in recipe.stdout, recipe.stderr[-2000:]


def test_training_output_is_quiet_outside_a_terminal(tmp_path):
    result = run_rlx(["train", "steps=1", "prompts_per_step=2", "rollout.samples_per_prompt=2", "eval.size=4",
                      "rollout.max_new_tokens=8", "save.plot=false", "hardware.num_threads=1"], tmp_path, timeout=300,
                     env_extra={"RLX_VERBOSE": "0"})
    assert result.returncode == 0, result.stderr[-3000:]
    for noise in ("Loading weights", "Writing model shards", "Warning", "\r", "\x1b["):
        assert noise not in result.stderr + result.stdout, f"{noise!r} in the output:\n{result.stderr[-2000:]}"
    assert "step 1/1" in result.stdout + result.stderr  # rlx's own lines stay
