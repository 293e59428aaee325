"""How a GRPO step's time grows with completion length and group size, rlx beside TRL (make bench-growth).

    python benchmarks/grpo_vs_trl.py --threads 2 --rounds 1 --steps 1 \\
        --settings "0.5b 2x4x16,0.5b 2x4x64,0.5b 2x4x128,0.5b 2x4x256,0.5b 2x2x64,0.5b 2x8x64"
    python benchmarks/growth_plot.py          # -> benchmarks/results/growth_0.5b.png and a table
    # the committed one:
    python benchmarks/growth_plot.py --point64 "0.5b 2x4x64 adamw-loop" --title " (rlx: AdamW loop)"

Reads the result files grpo_vs_trl.py wrote for those settings (fp32 CPU, no LoRA, no KL, default rlx
options) and draws two panels: median step time against forced completion length (2 prompts x 4 samples)
and against group size (2 prompts, 64 tokens), with the compute floor of each point.
"""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
LENGTHS = [16, 64, 128, 256]  # 2 prompts x 4 samples
GROUPS = [2, 4, 8]  # 2 prompts x 64 tokens


def load(setting: str) -> dict | None:
    path = RESULTS / ("grpo_vs_trl_" + setting.replace(" ", "_") + ".json")
    return json.loads(path.read_text()) if path.is_file() else None


def series(settings: list[tuple[int, str]]) -> list[tuple[int, float, float, float]]:
    """(x, rlx median step s, TRL median step s, floor s) for each setting that has a result file."""
    out = []
    for x, setting in settings:
        result = load(setting)
        if result is not None:
            out.append((x, result["rlx"][0], result["trl"][0], result["floor_s"]))
    return out


def main() -> None:
    import argparse

    import matplotlib

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--point64", default="0.5b 2x4x64",
                        help="the setting whose result is the 2 x 4 x 64 point of both panels (the committed plot: "
                             "'0.5b 2x4x64 adamw-loop', the run taken in the same batch as the others, before rlx's "
                             "optimizer became torch's fused AdamW)")
    parser.add_argument("--title", default="")
    args = parser.parse_args()

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("completion tokens (2 prompts x 4 samples)",
         series([(n, args.point64 if n == 64 else f"0.5b 2x4x{n}") for n in LENGTHS])),
        ("group size (2 prompts x 64 tokens)",
         series([(g, args.point64 if g == 4 else f"0.5b 2x{g}x64") for g in GROUPS])),
    ]
    figure, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for axis, (label, points) in zip(axes, panels):
        xs = [p[0] for p in points]
        for column, name, style in ((1, "rlx", "o-"), (2, "TRL 1.16", "s-"), (3, "compute floor", "k:")):
            axis.plot(xs, [p[column] for p in points], style, label=name)
        axis.set_xlabel(label)
        axis.set_ylabel("s per step")
        axis.set_xticks(xs)
        axis.grid(alpha=0.3)
    axes[0].legend()
    figure.suptitle("GRPO step time, random-init Qwen2.5-0.5B shape, fp32, 2 CPU threads" + args.title)
    figure.tight_layout()
    target = RESULTS / "growth_0.5b.png"
    figure.savefig(target, dpi=110)
    print(f"wrote {target}")
    print("| setting | rlx s/step | TRL s/step | rlx/TRL time | floor s |")
    print("|---|---|---|---|---|")
    for label, points in panels:
        for x, rlx, trl, floor in points:
            print(f"| {label.split(' (')[0]} {x} | {rlx:.2f} | {trl:.2f} | {rlx / trl:.2f} | {floor:.2f} |")


if __name__ == "__main__":
    main()
