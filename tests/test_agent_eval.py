"""Held-out environment metrics (rlx/evaluation/agents.py): pass@k over episodes, intervals over tasks."""

import numpy as np
import pytest

from rlx.evaluation.agents import summarize_env_eval


def test_summarize_env_eval_hand_numbers():
    # task 0: one success in two episodes; task 1: none.  success 0.25; pass@1 = mean(1/2, 0) = 0.25;
    # pass@2 = mean(1, 0) = 0.5; returns [[1, 0], [0, 0]]; turns [[2, 4], [6, 6]] -> 4.5
    success = np.array([[1.0, 0.0], [0.0, 0.0]])
    summary, per_task = summarize_env_eval(success, success.copy(), np.array([[2.0, 4.0], [6.0, 6.0]]), ks=[1, 2, 4])
    assert summary["success"][0] == pytest.approx(0.25)
    assert summary["pass@1"][0] == pytest.approx(0.25) and summary["pass@2"][0] == pytest.approx(0.5)
    assert "pass@4" not in summary  # k above the episodes per task is skipped
    assert summary["turns"][0] == pytest.approx(4.5)
    low, high = summary["pass@2"][1:]
    assert 0.0 <= low <= 0.5 <= high <= 1.0
    assert per_task["pass@2"].tolist() == [1.0, 0.0]
