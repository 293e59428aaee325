"""`rlx eval`: the Hydra front of an evaluation (rlx/evaluation/runner.py does the work), and the resolver that
names its output directory (conf/eval.yaml: hydra.run.dir)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

import rlx.cli.registries  # noqa: F401  every registry publishes its names before the config is checked
from rlx.config.paths import CONF_DIR
from rlx.errors import StorageError, UserError, fail
from rlx.evaluation.runner import evaluate, headline


def _eval_dir(resume, name) -> str:
    """Output directory: the resumed one, or outputs/eval/<time>_<name>."""
    if resume not in (None, "", "None", "null"):
        return str(resume)
    import os

    root = os.environ.get("RLX_OUTPUTS", "outputs")
    return f"{root}/eval/{datetime.now().strftime('%Y-%m-%d_%H-%M-%S.%f')}_{name}"


if not OmegaConf.has_resolver("rlx_eval_dir"):
    OmegaConf.register_new_resolver("rlx_eval_dir", _eval_dir)


def eval_here(cfg: DictConfig, out_dir: Path, overrides: list[str], model_choice: str | None) -> dict:
    """One evaluation on the composed eval config into `out_dir` (rlx.evaluate calls it directly, `rlx eval` through
    its Hydra front): a model preset's tuning applied (`model_choice`: the model group's option, e.g.
    smollm2-135m-instruct), then rlx/evaluation/runner.py. Returns summary.json's content. A storage fault says
    what survived and how to resume; a run rejected before any result leaves no directory behind."""
    from rlx.config.schema import apply_benchmark_tuning, drop_train_tuning

    drop_train_tuning(cfg, "eval")  # a model preset's tuning: its sampling stays, `rlx train`'s run length goes
    if not cfg.run and not cfg.resume:  # the preset's prompt, verifier and difficulty of each benchmark it tunes
        apply_benchmark_tuning(cfg, model_choice)
    try:
        return evaluate(cfg, out_dir, overrides)
    except StorageError as exc:  # finished problems stay in the results files; resume generates only the rest
        if (out_dir / "config.yaml").is_file():
            exc.survived = f"the problems already scored stay in {out_dir}/*/*.jsonl"
            exc.command = f"rlx eval resume={out_dir}"
        else:
            exc.survived = "nothing was evaluated yet"
        raise
    except UserError:
        if not cfg.resume:
            from rlx.runtime.unstarted import discard_unstarted

            discard_unstarted(out_dir)  # rejected before any result: no directory is left behind
        raise


@hydra.main(config_path=str(CONF_DIR), config_name="eval", version_base="1.3")
def eval_app(cfg: DictConfig) -> float | None:
    from hydra.core.hydra_config import HydraConfig

    hydra_cfg = HydraConfig.get()
    try:
        summary = eval_here(cfg, Path(hydra_cfg.runtime.output_dir), list(hydra_cfg.overrides.task),
                            hydra_cfg.runtime.choices.get("model"))
    except StorageError as exc:
        fail(str(exc), code=3)
    except UserError as exc:
        fail(str(exc))
    return headline(summary)
