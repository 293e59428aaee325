"""Every numeric and enum knob is type- and range-checked up front, with its name (issue 17)."""

import pytest

from rlx.config import UserError, check_overrides, group_options
from rlx.config_checks import check_settings
from rlx.config_schema import TRAIN_KNOBS, check_knobs
from tests.conftest import run_rlx

BAD = [
    ("steps=abc", "steps=abc"), ("steps=1.5", "steps=1.5"), ("seed=-1", "seed=-1"), ("optim.lr=0", "optim.lr=0"),
    ("optim.lr=nan", "optim.lr=nan"), ("optim.schedule=cosin", "constant, cosine, linear"),
    ("optim.warmup_steps=-1", "optim.warmup_steps"), ("optim.betas=[0.9,1.5]", "optim.betas"),
    ("optim.max_grad_norm=0", "optim.max_grad_norm"), ("rollout.temperature=0", "rollout.temperature=0"),
    ("rollout.top_p=0", "(0, 1]"), ("rollout.top_p=1.5", "rollout.top_p=1.5"), ("rollout.max_new_tokens=0", ">= 1"),
    ("rollout.top_k=-1", "rollout.top_k"), ("eval.batch_size=0", "eval.batch_size"), ("log.every=0", "log.every"),
    ("checkpoint.keep=0", "checkpoint.keep"), ("checkpoint.every=-1", "checkpoint.every"),
    ("model.dtype=float33", "model.dtype"), ("model.lora.rank=0", "model.lora.rank"),
    ("model.lora.dropout=1.5", "model.lora.dropout"), ("hardware.mixed_precision=fp8x", "hardware.mixed_precision"),
    ("reward.on_error=foo", "raise, zero"), ("algorithm.epochs=0", "algorithm.epochs"),
    ("log.progress=maybe", "auto, true, false"), ("data.eval_size=-1", "data.eval_size"),
]


@pytest.mark.parametrize("override,needle", BAD)
def test_a_bad_knob_is_named_with_its_valid_range(override, needle):
    with pytest.raises(UserError) as info:
        check_settings(check_overrides([override]))
    assert needle in str(info.value) and override.split("=")[0] in str(info.value)


@pytest.mark.parametrize("option", group_options("recipes"))
def test_every_shipped_recipe_passes_the_schema(option):
    check_knobs(check_overrides([f"recipes={option}"]))


def test_every_knob_of_the_schema_exists_in_some_config():
    composed = [check_overrides([]), check_overrides(["algorithm=ppo"]), check_overrides(["algorithm=dpo", "data=prefs"])]
    from rlx.config_schema import _lookup

    missing = [k.name for k in TRAIN_KNOBS if not any(_lookup(cfg, k.name)[0] for cfg in composed)]
    assert missing == [], missing  # a renamed knob must not silently leave the schema unchecked


def test_bad_knob_from_the_cli_is_one_line_exit_2_before_loading(tmp_path):
    result = run_rlx(["train", "rollout.temperature=-1"], tmp_path, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: rollout.temperature=-1 is not valid")
    assert "Loading weights" not in result.stderr


EVAL_BAD = [
    ("sampling.temperature=0", "sampling.temperature=0"), ("sampling.top_p=2", "(0, 1]"),
    ("sampling.n=-1", "sampling.n"), ("sampling.n=two", "sampling.n=two"), ("sampling.batch_size=0", "sampling.batch_size"),
    ("metrics.confidence=1", "(0, 1)"), ("metrics.bootstrap_resamples=0", "metrics.bootstrap_resamples"),
    ("limit=0", "limit=0"), ("progress=maybe", "auto, true, false"), ("sampling.max_new_tokens=0", ">= 1"),
]


@pytest.mark.parametrize("override,needle", EVAL_BAD)
def test_a_bad_eval_knob_is_named_with_its_valid_range(override, needle):
    from omegaconf import OmegaConf

    from rlx.evaluation.runner import check_settings as check_eval

    cfg = check_overrides([override], config_name="eval")
    with pytest.raises(UserError) as info:
        check_eval(OmegaConf.create(OmegaConf.to_container(cfg, resolve=True)))
    assert needle in str(info.value) and override.split("=")[0] in str(info.value)


def test_every_eval_knob_exists_in_the_eval_config():
    from rlx.config_schema import EVAL_KNOBS, _lookup

    cfg = check_overrides([], config_name="eval")
    assert [k.name for k in EVAL_KNOBS if not _lookup(cfg, k.name)[0]] == []
    from rlx.evaluation.runner import check_settings as check_eval

    check_eval(cfg)  # the defaults pass
