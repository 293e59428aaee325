"""`rlx sweep`: a sweep from conf/sweep/ as a Hydra multirun, every trial checked to compose first; `rlx sweep retest`
re-runs a sweep's best trial on fresh seeds. Trial results and summaries: rlx/report/sweeps.py."""

from __future__ import annotations

import csv
import logging
from pathlib import Path

from rlx.report.sweeps import DEFAULT_TEST_SEEDS, SUMMARY_CSV, trial_dirs

log = logging.getLogger("rlx")

def best_overrides(sweep_dir: Path) -> list[str]:
    """Overrides of the best finished trial in sweep_dir (from its summary.csv), without seed=."""
    from rlx.errors import UserError

    summary = sweep_dir / SUMMARY_CSV
    if not summary.is_file():
        raise UserError(f"{summary} not found; pass the directory of a finished sweep (it holds summary.csv)")
    try:
        with summary.open(encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
        if rows and not {"status", "overrides"} <= set(rows[0]):
            raise ValueError(f"no 'status' and 'overrides' columns, found {', '.join(map(str, rows[0]))}")
    except (ValueError, csv.Error) as exc:  # UnicodeDecodeError is a ValueError
        raise UserError(f"{summary} is damaged or was not written by rlx sweep ({exc}); pass the directory of a "
                        "finished sweep") from None
    finished = [r for r in rows if r["status"] == "ok"]
    if not finished:
        raise UserError(f"no trial of {sweep_dir} finished; nothing to re-run")
    tokens = finished[0]["overrides"].split()
    # the seed is replaced by test seeds; `sweep=` would start the search again instead of one grid
    return [t for t in tokens if t.split("=", 1)[0].lstrip("+~") not in ("seed", "sweep") and not t.startswith("hydra")]


def tuning_seeds(sweep_dir: Path) -> set[int]:
    """Seeds the sweep's trials used (from each trial's config.yaml)."""
    from omegaconf import OmegaConf

    seeds = set()
    for trial in trial_dirs(sweep_dir):
        config = trial / "config.yaml"
        if config.is_file():
            seeds.add(int(OmegaConf.load(config).get("seed", 0)))
    return seeds


def sweep_command(args: list[str], launch) -> None:
    """`rlx sweep NAME [overrides]` and `rlx sweep retest SWEEP_DIR [seeds=a,b,c] [overrides]`.

    launch(hydra_args) runs the training app with Hydra's command line (rlx.cli provides it)."""
    from rlx.config.paths import group_options
    from rlx.errors import UserError

    valid = group_options("sweep")
    if not args or args[0] in ("-h", "--help"):
        print("usage: rlx sweep NAME [key=value ...]      (NAME: " + ", ".join(valid) + ")\n"
              "       rlx sweep retest SWEEP_DIR [seeds=1000,1001,1002] [key=value ...]")
        return
    if args[0] == "retest":
        if len(args) < 2:
            raise UserError("rlx sweep retest needs the sweep directory: rlx sweep retest SWEEP_DIR [seeds=...]")
        retest(Path(args[1]), args[2:], launch)
        return
    name, rest = args[0], args[1:]
    if name not in valid:
        import difflib

        close = difflib.get_close_matches(name, valid, n=1, cutoff=0.5)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise UserError(f"unknown sweep '{name}'{hint}; valid choices: {', '.join(valid)}")
    launch(["-m", f"sweep={name}", *rest])


def retest(sweep_dir: Path, args: list[str], launch) -> Path:
    """Re-run the best trial of sweep_dir on test seeds into SWEEP_DIR/test_seeds and report it there."""
    from rlx.errors import UserError

    seeds = [str(s) for s in DEFAULT_TEST_SEEDS]
    extra = []
    for arg in args:
        if arg.startswith("seeds="):
            seeds = [s for s in arg.split("=", 1)[1].split(",") if s]
        else:
            extra.append(arg)
    if not all(s.lstrip("-").isdigit() for s in seeds) or not seeds:
        raise UserError(f"seeds={','.join(seeds)} must be a comma-separated list of integers, e.g. "
                        "seeds=1000,1001,1002")
    if not (sweep_dir / SUMMARY_CSV).is_file():
        raise UserError(f"{sweep_dir / SUMMARY_CSV} not found; pass the directory of a finished sweep (it holds "
                        "summary.csv)")
    overlap = tuning_seeds(sweep_dir) & {int(s) for s in seeds}
    if overlap:
        raise UserError(f"test seeds {sorted(overlap)} were already used for tuning in {sweep_dir}; pick fresh ones, "
                        f"e.g. seeds={','.join(str(s) for s in DEFAULT_TEST_SEEDS)}")
    extra_keys = {a.split("=", 1)[0].lstrip("+~") for a in extra}
    best = [o for o in best_overrides(sweep_dir) if o.split("=", 1)[0].lstrip("+~") not in extra_keys]
    out = sweep_dir / "test_seeds"
    log.info("re-running the best trial (%s) on test seeds %s into %s", " ".join(best), ",".join(seeds), out)
    launch(["-m", *best, *extra, f"seed={','.join(seeds)}", f"hydra.sweep.dir={out}"])
    from rlx.report.report import write_report

    result = write_report([out], out / "report")
    print(result["summary"].read_text())
    print(f"done: {out}  test-seed report: {result['summary']}")
    return out


# --------------------------------------------------------------------------------------------
# Before a multirun starts (rlx.cli): one sweep directory, every combination composes
# --------------------------------------------------------------------------------------------
SEARCH_KEYS = ("algorithm", "name", "recipes", "sweep")  # keys the run name depends on


def grid_combinations(overrides: list[str], extra_params: dict | None = None) -> list[list[str]]:
    """Every combination of a basic-sweeper multirun: `seed=0,1 algorithm=grpo,dapo` -> 4 override lists
    (the sweep file's hydra.sweeper.params as extra_params {key: "a,b"})."""
    import itertools

    from hydra.core.override_parser.overrides_parser import OverridesParser

    texts = list(overrides) + [f"{k}={v}" for k, v in (extra_params or {}).items()]
    parsed = OverridesParser.create().parse_overrides(texts)
    choices = []
    for override, text in zip(parsed, texts):
        prefix = text.split("=", 1)[0]
        if override.is_sweep_override() and override.is_interval_sweep():  # interval(a,b): a search space
            raise ValueError(f"{text} is a search space, not a list")
        if override.is_sweep_override():
            choices.append([f"{prefix}={v}" for v in override.sweep_string_iterator()])
        else:
            choices.append([text])
    return [list(combo) for combo in itertools.product(*choices)]


def sweeper_params(overrides: list[str]) -> tuple[str, dict]:
    """(sweeper target, hydra.sweeper.params) of the composed config (a sweep file sets them)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from rlx.config.paths import CONF_DIR

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name="train", overrides=[o for o in overrides if "," not in o.split("=", 1)[-1]
                                                           or o.startswith("sweep=")], return_hydra_config=True)
        params = OmegaConf.to_container(cfg.hydra.sweeper.get("params") or {}, resolve=False)
        return str(cfg.hydra.sweeper.get("_target_", "")), {k: str(v) for k, v in params.items()}
    except Exception:
        return "", {}
    finally:
        GlobalHydra.instance().clear()


def check_every_trial(overrides: list[str], config_name: str = "train") -> int:
    """Compose every combination of a grid multirun before the first trial starts; a combination that
    does not compose stops the sweep with one line naming it (e.g. a key of one algorithm family swept
    together with an algorithm of another family). Returns the number of combinations checked (0 for an
    Optuna search, whose trials are sampled as it goes: its first values were checked already)."""
    import contextlib
    import io

    from rlx.config.overrides import check_overrides
    from rlx.config.schema import check_config
    from rlx.errors import UserError

    task = [o for o in overrides if not o.startswith(("hydra.", "hydra/"))]
    target, params = sweeper_params(task) if config_name == "train" else ("", {})
    if "optuna" in target.lower():
        return 0
    try:
        combos = grid_combinations(task, {k: v for k, v in params.items() if k not in {o.split("=")[0] for o in task}})
    except ValueError:  # an interval search space: the sweeper samples it
        return 0
    for number, combo in enumerate(combos):
        if len(combos) == 1:
            break
        stderr = io.StringIO()
        varying = [o for o in combo if o not in task]
        try:
            with contextlib.redirect_stderr(stderr):
                cfg = check_overrides([o for o in combo if not o.startswith("sweep=")] if params else combo,
                                      config_name)
        except SystemExit:
            message = stderr.getvalue().strip().removeprefix("error: ")
            raise UserError(f"sweep combination {number + 1} of {len(combos)} ({' '.join(varying) or ' '.join(combo)}) "
                            f"does not compose: {message}; nothing was run") from None
        try:  # types and ranges of every knob, as the trial would check them only when its turn comes
            check_config(cfg, config_name)
        except UserError as exc:
            raise UserError(f"sweep combination {number + 1} of {len(combos)} ({' '.join(varying) or ' '.join(combo)}) "
                            f"is refused: {exc}; nothing was run") from None
    return len(combos)


def default_sweep_dir(overrides: list[str], name: str) -> str:
    """One directory for the whole multirun: <outputs>/multirun/<time>_<name>, where name is the run name
    unless the sweep varies what it depends on (then `multirun`), so `-m algorithm=grpo,dapo` is one sweep."""
    import os
    from datetime import datetime

    varied = any("," in o.split("=", 1)[-1] and o.split("=", 1)[0].lstrip("+~").split(".")[0] in SEARCH_KEYS
                 for o in overrides if "=" in o)
    label = "multirun" if varied else name
    stamp = datetime.now().strftime("%Y-%m-%d_%H-%M-%S.%f")
    return str(Path(os.environ.get("RLX_OUTPUTS", "outputs")) / "multirun" / f"{stamp}_{label}")
