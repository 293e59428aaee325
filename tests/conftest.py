import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# as the commands do: every registry publishes its names before a test checks a config in-process
# (rlx/config/groups.py reads them through rlx.registry.published)
import rlx.cli.registries  # noqa: E402, F401

REPO = Path(__file__).resolve().parents[1]


def run_rlx(args, tmp_path, timeout=600, env_extra=None):
    """Run `rlx ...` as a real subprocess with outputs under tmp_path."""
    # PYTHONPATH pins the code under test to this checkout (not whatever `rlx` is installed)
    pythonpath = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, RLX_OUTPUTS=str(tmp_path / "outputs"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               PYTHONPATH=pythonpath)
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-m", "rlx", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout
    )


def only_run_dir(tmp_path, kind="train"):
    runs = sorted((tmp_path / "outputs" / kind).iterdir())
    assert len(runs) == 1, runs
    return runs[0]


@pytest.fixture
def rlx_cli():
    return run_rlx


@pytest.fixture
def fakes():
    """make(**kwargs) -> a FakeVLLM (tests/fake_vllm.py) on a port the OS picks, closed after the test."""
    from tests.fake_vllm import FakeVLLM

    made = []

    def make(**kwargs):
        made.append(FakeVLLM(**kwargs))
        return made[-1]

    yield make
    for fake in made:
        fake.close()
