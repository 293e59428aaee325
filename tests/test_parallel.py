"""Data parallelism: N gloo processes on the CPU take the same optimizer steps as one process.

The settings make every shortcut visible: two prompts per process with batch-std advantage scaling
(per-process advantages would differ), token-mean loss (a per-process token count would differ), and
an Adam eps that makes the update proportional to the gradient (a missing x N loss scale would halve it).
"""

import pytest

from tests.parallel_helpers import assert_same_parameters

pytestmark = pytest.mark.slow  # ~40 s per loop family on 2 idle cores (two runs, one with 2 processes)


def test_grpo_two_processes_match_one(tmp_path):
    assert_same_parameters(tmp_path, ["steps=2", "prompts_per_step=4", "rollout.samples_per_prompt=4",
                                      "algorithm.scale=batch", "algorithm.kl_coef=0.1"])


def test_sft_two_processes_match_one(tmp_path):
    assert_same_parameters(tmp_path, ["algorithm=sft", "steps=2", "algorithm.batch_size=8", "micro_batch_size=2"])


def test_dpo_two_processes_match_one(tmp_path):
    # reference log-probs precomputed on every process; the pair loss is a mean over the global batch
    assert_same_parameters(tmp_path, ["algorithm=dpo", "data=prefs", "steps=2", "algorithm.batch_size=8",
                                      "micro_batch_size=2"])
