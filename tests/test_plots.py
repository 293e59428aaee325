"""Run plot: one panel per signal present (reward raw + smoothed, accuracy, KL, entropy, length, clipping);
rlx eval's plot adds the paired difference when compare= is set."""

import json

import matplotlib.image

from rlx.runtime.rundir import plot_run, smooth


def test_smooth_is_a_trailing_moving_average():
    assert smooth([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]


def _write(run, rows):
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_run_plot_has_a_panel_per_signal(tmp_path):
    full = [{"step": s, "reward/total": 0.1 * s, "train/kl_ref": 0.01, "train/entropy": 0.5,
             "completions/mean_length": 10.0, "train/clip_frac_low": 0.01, "train/clip_frac_high": 0.02,
             **({"eval/accuracy": 0.5} if s % 5 == 0 else {})} for s in range(1, 31)]
    _write(tmp_path / "full", full)
    height, width, _ = matplotlib.image.imread(plot_run(tmp_path / "full")).shape
    assert (height, width) == (640, 1380)  # 2 rows x 3 panels at 100 dpi
    _write(tmp_path / "two", [{"step": s, "reward/total": 0.1 * s, "eval/accuracy": 0.5} for s in range(3)])
    height, width, _ = matplotlib.image.imread(plot_run(tmp_path / "two")).shape
    assert (height, width) == (320, 920)  # reward and accuracy only: 1 row x 2 panels
    _write(tmp_path / "none", [{"step": 0, "perf/tokens_per_s": 1.0}])
    assert plot_run(tmp_path / "none") is None


def test_eval_plot_adds_the_paired_difference_row(tmp_path):
    from rlx.evaluation.summary import plot_pass_at_k

    entry = {"value": 0.5, "low": 0.4, "high": 0.6}
    result = {"model": {"pass@1": entry, "pass@2": entry}, "compare": {"pass@1": entry, "pass@2": entry}}
    alone = plot_pass_at_k({"benchmarks": {"b": result}}, {"model": "run_a", "compare": "base"}, tmp_path / "a.png")
    paired = dict(result, diff={"problems": 10, "pass@1": {"value": 0.1, "low": 0.0, "high": 0.2, "frac_positive": 0.9},
                                "pass@2": {"value": 0.1, "low": 0.0, "high": 0.2, "frac_positive": 0.9}})
    both = plot_pass_at_k({"benchmarks": {"b": paired}}, {"model": "run_a", "compare": "base"}, tmp_path / "b.png")
    assert matplotlib.image.imread(alone).shape[0] == 400 and matplotlib.image.imread(both).shape[0] == 750


def test_eval_plot_labels_k_plainly_and_names_both_models(tmp_path, monkeypatch):
    import matplotlib.figure

    from rlx.evaluation.summary import plot_pass_at_k

    entry = {"value": 0.5, "low": 0.4, "high": 0.6}
    result = {"model": {"pass@1": entry, "pass@4": entry}, "compare": {"pass@1": entry, "pass@4": entry},
              "diff": {"problems": 3, "pass@1": entry, "pass@4": entry}}
    drawn = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: drawn.append(fig))
    plot_pass_at_k({"benchmarks": {"b": result}}, {"model": "run_a", "compare": "base (builtin:tiny)"},
                   tmp_path / "p.png")
    (fig,) = drawn
    top, bottom = fig.axes
    assert [t.get_text() for t in top.get_xticklabels()] == ["1", "4"]
    assert [t.get_text() for t in top.get_legend().get_texts()] == ["run_a", "base (builtin:tiny)"]
    assert [t.get_text() for t in bottom.get_legend().get_texts()] == ["run_a - base (builtin:tiny)"]
