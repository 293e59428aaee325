"""benchmarks/seed_ablation.py keeps a run that failed only after its last step's evaluation (a final checkpoint that
could not be written) and drops one that failed before it."""

from benchmarks.seed_ablation import finals
from rlx.report.runs import Run


def _run(tmp_path, name, last_eval_step, failed, seed):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.yaml").write_text("steps: 12\n")
    rows = [{"step": 6, "eval/accuracy": 0.1}, {"step": last_eval_step, "eval/accuracy": [0.2, 0.3, 0.4][seed]}]
    return Run(folder, [f"seed={seed}"], seed, rows, {}, failed)


def test_a_failure_after_the_last_evaluation_keeps_the_score(tmp_path):
    runs = [_run(tmp_path, "clean", 12, "", 0),
            _run(tmp_path, "save_failed", 12, "RuntimeError: disk full", 1),
            _run(tmp_path, "crashed_midway", 9, "RuntimeError: boom", 2)]
    assert finals(runs, "eval/accuracy") == [0.2, 0.3]
