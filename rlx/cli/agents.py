"""`python -m rlx.evaluation.agents --model M --env grid [--compare M2]`: the alias of `rlx eval env=...`, its
arguments turned into the command's overrides (rlx/evaluation/agents/__main__.py runs it)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rlx.cli import main as rlx_main


def main(argv: list[str] | None = None) -> int:
    """python -m rlx.evaluation.agents --model PATH --env grid [--compare PATH]: an alias of
    `rlx eval env=grid model.path=PATH [compare=PATH]` (success, return, turns and pass@k over held-out
    environment seeds with bootstrap intervals and a paired comparison)."""
    parser = argparse.ArgumentParser(prog="python -m rlx.evaluation.agents", description=main.__doc__)
    parser.add_argument("--model", required=True, help="builtin:NAME, a save_pretrained folder or a run directory")
    parser.add_argument("--compare", default=None, help="a second model, compared on the same tasks and seeds")
    parser.add_argument("--env", default="grid", help="an env config name (conf/env/NAME.yaml)")
    parser.add_argument("--tasks", type=int, default=100, help="held-out tasks (environment seeds)")
    parser.add_argument("--samples", type=int, default=8, help="sampled episodes per task (0: one greedy episode)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--ks", type=int, nargs="*", default=[1, 2, 4, 8])
    parser.add_argument("--seed", type=int, default=0)
    args, rest = parser.parse_known_args(argv)
    from rlx.models.loading import gguf_source, is_run_model

    model = Path(args.model).expanduser()
    run_dir = model.is_dir() and not is_run_model(model) and gguf_source(args.model) is None
    subject = f"run={args.model}" if run_dir else f"model.path={args.model}"
    overrides = [subject, f"env={args.env}", f"limit={args.tasks}", f"sampling.n={args.samples}",
                 f"sampling.greedy={str(args.samples == 0).lower()}", f"sampling.temperature={args.temperature}",
                 f"metrics.ks=[{','.join(map(str, args.ks))}]", f"seed={args.seed}", "name=env_eval"]
    if args.compare:
        overrides.append(f"compare={args.compare}")
    rlx_main(["eval", *overrides, *rest])
    return 0

