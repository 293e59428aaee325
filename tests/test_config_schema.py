"""Every knob is type- and range-checked up front against the typed schema of its group, with its name
(issues 15 and 17): rlx/config/schema.py, groups.py and families.py declare each knob once, YAML holds its default and
comment."""

import dataclasses
import typing

import pytest
from omegaconf import DictConfig

from rlx.config.overrides import check_overrides
from rlx.config.paths import config_groups, group_options
from rlx.config.rules import check_settings
from rlx.config.schema import (
    DISPATCH,
    SCHEMAS,
    _present,
    _unpack,
    check_config,
    dispatched,
    drop_train_tuning,
    schema_fields,
)
from rlx.config.settings import checked_settings
from rlx.errors import UserError
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
        check_settings(checked_settings(check_overrides([override])))
    assert needle in str(info.value) and override.split("=")[0] in str(info.value)


@pytest.mark.parametrize("option", group_options("recipes"))
def test_every_shipped_recipe_passes_the_schema(option):
    check_config(check_overrides([f"recipes={option}"]))


# the primary configs and the groups each composes (conf/<name>.yaml defaults lists)
PRIMARY = {"train": ("model", "algorithm", "reward", "data", "rollout", "env", "hardware", "logger", "sweep"),
           "eval": ("model", "benchmark", "suite", "env", "rollout", "hardware"),
           "data_prefs": ("model", "data", "reward", "rollout", "hardware")}
# options that need a partner to compose into a config a run would use
PARTNERS = {("algorithm", "agent_grpo"): ["env=grid"], ("algorithm", "gigpo"): ["env=grid"],
            ("algorithm", "mt_grpo"): ["env=tool_use"], ("algorithm", "agent_sft"): ["env=grid"]}


def _compositions():
    """(config name, overrides) composing every option file of every group under conf/, and every recipe."""
    for config_name, groups in PRIMARY.items():
        yield config_name, []
        for group in groups:
            for option in group_options(group):
                yield config_name, [f"{group}={option}", *PARTNERS.get((group, option), [])]
    for option in group_options("recipes"):
        yield "train", [f"recipes={option}"]


def _used_fields(node: DictConfig, schema: type, used: set, prefix: str = "") -> None:
    """Record (schema, field) for every key of a composed config, following nested sections."""
    schema = dispatched(schema, node, prefix)
    known = schema_fields(schema)
    for key in map(str, node.keys()):  # missing values (`???`, e.g. data.train_path) too
        if prefix or key != "hydra":
            assert key in known, (f"{prefix}{key} has no field in rlx/config/ (schema.py, groups.py, families.py: "
                                  f"{schema.__name__})")
            used.add((schema, key))
    for key, value in _present(node):
        if not prefix and key == "hydra":
            continue
        _, kinds = _unpack(known[key][0])
        for kind in kinds:
            if dataclasses.is_dataclass(kind) and isinstance(value, DictConfig):
                _used_fields(value, kind, used, f"{prefix}{key}.")
            if typing.get_origin(kind) is dict and dataclasses.is_dataclass(typing.get_args(kind)[1]):
                for entry, section in _present(value):
                    _used_fields(section, typing.get_args(kind)[1], used, f"{prefix}{key}.{entry}.")


def _all_schemas() -> set:
    """Every schema reachable from the primary configs, dispatched ones included."""
    seen, todo = set(), list(SCHEMAS.values())
    while todo:
        schema = todo.pop()
        if schema in seen:
            continue
        seen.add(schema)
        todo += DISPATCH.get(schema, (None, {}))[1].values()
        for kind, _ in schema_fields(schema).values():
            for member in _unpack(kind)[1]:
                args = typing.get_args(member) if typing.get_origin(member) is dict else (member,)
                todo += [a for a in args if dataclasses.is_dataclass(a)]
    return seen


def test_every_shipped_yaml_key_has_a_schema_field_and_every_field_a_key():
    """A new knob cannot skip typing (its key fails here until a dataclass in rlx/config/ declares it), and a
    removed one cannot leave a stale field. Groups are composed in each primary config they belong to."""
    # tuning: no group a user picks; model=NAME composes its files (conf/tuning/), checked with each model option
    assert set(config_groups()) - {"recipes", "tuning"} <= {g for groups in PRIMARY.values() for g in groups}
    used = set()
    for config_name, overrides in _compositions():
        cfg = check_overrides(overrides, config_name=config_name)
        drop_train_tuning(cfg, config_name)  # as `rlx data prefs` does: a model's tuning for rlx train alone
        _used_fields(cfg, SCHEMAS[config_name], used)
        check_config(cfg, config_name)  # and every shipped value passes its type and range
    unused = sorted(f"{schema.__name__}.{name}" for schema in _all_schemas() if schema not in DISPATCH
                    for name in schema_fields(schema) if (schema, name) not in used
                    and not any((sub, name) in used for sub in _all_schemas() if issubclass(sub, schema)))
    assert unused == []


TYPED = [  # (overrides, the line's start): a wrong type, a range, a closed set, in several groups
    (["model.lora.enabled=yes"], "model.lora.enabled=yes is not valid: it must be true or false"),
    (["model.lora.rank=2.5"], "model.lora.rank=2.5 is not valid: it must be an integer >= 1"),
    (["rollout=vllm", "rollout.gpu_memory_utilization=1.5"],
     "rollout.gpu_memory_utilization=1.5 is not valid: it must be a number in (0, 1]"),
    (["hardware=deepspeed_zero2", "hardware.deepspeed.zero_stage=4"],
     "hardware.deepspeed.zero_stage=4 is not valid: it must be an integer in [1, 3]"),
    (["hardware.distributed=mpi"], "unknown hardware.distributed 'mpi'; valid choices: no, ddp, fsdp, deepspeed"),
    (["algorithm=dpo", "data=prefs", "algorithm.loss_type=dpoo"],
     "unknown algorithm.loss_type 'dpoo'; valid choices: dpo, cdpo"),
    (["algorithm=dpo", "data=prefs", "algorithm.beta=0"], "algorithm.beta=0 is not valid: it must be a number > 0"),
    (["algorithm=dpo", "data=prefs", "data.pairs.truncation=cut"],
     "unknown data.pairs.truncation 'cut'; valid choices: drop,"),
    (["algorithm=agent_grpo", "env=grid", "algorithm.credit=episode"],
     "unknown algorithm.credit 'episode'; valid choices: trajectory, gigpo, turn"),
    (["algorithm=agent_grpo", "env=grid", "env.max_turns=0"],
     "env.max_turns=0 is not valid: it must be an integer >= 1"),
    (["algorithm=ppo", "algorithm.lam=1.5"], "algorithm.lam=1.5 is not valid: it must be a number in [0, 1]"),
    (["algorithm=ppo", "algorithm.whiten_advantages=1"],
     "algorithm.whiten_advantages=1 is not valid: it must be true or false"),
    (["algorithm.kl_estimator=k4"], "unknown algorithm.kl_estimator 'k4'; valid choices: k1, k2, k3"),
    (["logger=wandb", "logger.mode=on"], "unknown logger.mode 'on'; valid choices: online, offline, disabled"),
    (["data.verifier=nope"], "unknown data.verifier 'nope'; valid choices: "),
    (["optim.betas=[0.9]"], "optim.betas=[0.9] is not valid: it must be two numbers in [0, 1)"),
    (["steps=null"], "steps=null is not valid: it must be an integer >= 1"),
    (["optim=fast"], "optim=fast is not valid: it must be a group of settings"),
]


FAMILY_KNOBS = [  # a knob the chosen option's family (backend) does not have: who has it
    (["+algorithm.vf_coef=0.1"], "algorithm.vf_coef is a ppo knob, not a knob of algorithm=grpo; use algorithm=ppo"),
    (["algorithm=dapo", "+algorithm.value_model=x"],
     "algorithm.value_model is a ppo knob, not a knob of algorithm=dapo"),
    (["algorithm=agent_grpo", "env=grid", "+algorithm.dynamic_sampling=true"],
     "algorithm.dynamic_sampling is a policy_gradient / ppo knob, not a knob of algorithm=agent_grpo; use "
     "algorithm=grpo or ppo"),
    (["algorithm=sft", "+algorithm.beta=0.1"],
     "algorithm.beta is a preference knob, not a knob of algorithm=sft; use algorithm=dpo"),
    (["+rollout.tis_cap=2"], "rollout.tis_cap is a vllm / server knob, not a knob of rollout=hf; use rollout=vllm or "
                             "server"),
    (["+optim.momentum=0.9"], "unknown key 'optim.momentum'"),
]


@pytest.mark.parametrize("overrides,start", TYPED + FAMILY_KNOBS, ids=[" ".join(o) for o, _ in TYPED + FAMILY_KNOBS])
def test_a_bad_value_or_another_familys_knob_is_one_line(overrides, start):
    with pytest.raises(UserError) as info:
        check_settings(checked_settings(check_overrides(overrides)))
    assert str(info.value).startswith(start) and "\n" not in str(info.value)


def test_a_ppo_knob_given_to_grpo_is_one_line_naming_ppo(capsys):
    """Without `+`, Hydra refuses the key before rlx's schema sees it ("Could not override
    'algorithm.vf_coef'"): check_overrides turns that into the same one line."""
    with pytest.raises(SystemExit) as info:
        check_overrides(["algorithm.vf_coef=0.1"])
    assert info.value.code == 2
    assert capsys.readouterr().err == ("error: algorithm.vf_coef is a ppo knob; use algorithm=ppo (or leave "
                                       "algorithm.vf_coef out)\n")
    for family_only in ("algorithm.gamma=0.9", "algorithm.lam=0.9", "algorithm.whiten_advantages=false"):
        with pytest.raises(SystemExit):
            check_overrides([family_only])  # grpo carries none of the critic's knobs
    check_overrides(["algorithm=ppo", "algorithm.vf_coef=0.1", "algorithm.gamma=0.9"])


def test_a_knob_under_another_familys_section_names_the_section(capsys):
    """`algorithm.replay.enabled=true` with an agent algorithm: the section (algorithm.replay) is the
    policy-gradient family's, and the one line says so instead of "unknown key"."""
    with pytest.raises(SystemExit) as info:
        check_overrides(["algorithm=gigpo", "env=grid", "algorithm.replay.enabled=true"])
    assert info.value.code == 2
    assert capsys.readouterr().err == ("error: algorithm.replay is a policy_gradient / ppo knob; use algorithm=grpo or "
                                       "ppo (or leave algorithm.replay out)\n")


def test_the_registries_and_the_schema_name_the_same_choices():
    from rlx.build import LOOPS
    from rlx.config import groups as schema  # the fixed sets of names (rlx/config/groups.py)
    from rlx.config.families import ALGORITHMS
    from rlx.data.preferences import LAYOUTS, ON_INVALID, PAIR_SOURCES, TRUNCATION_MODES
    from rlx.engines.sampling import SAMPLERS
    from rlx.engines.vllm import SEEDING
    from rlx.fleet.backends import ROLLOUT_BACKENDS
    from rlx.models.loading import DTYPES
    from rlx.runtime.optim import SCHEDULES

    def names(e):
        return [m.value for m in e]

    assert sorted(ALGORITHMS) == sorted(LOOPS) and list(schema.ROLLOUTS) == list(ROLLOUT_BACKENDS)
    assert list(schema.ROLLOUT_GIVES) == list(ROLLOUT_BACKENDS)  # each backend declares what it gives
    assert names(schema.Schedule) == list(SCHEDULES) and names(schema.DType) == list(DTYPES)
    assert names(schema.Sampler) == list(SAMPLERS) and names(schema.Seeding) == list(SEEDING)
    assert names(schema.PairSource) == list(PAIR_SOURCES) and names(schema.PairLayout) == list(LAYOUTS)
    assert names(schema.Truncation) == list(TRUNCATION_MODES) and names(schema.OnInvalid) == list(ON_INVALID)


def test_bad_knob_from_the_cli_is_one_line_exit_2_before_loading(tmp_path):
    result = run_rlx(["train", "rollout.temperature=-1"], tmp_path, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: rollout.temperature=-1 is not valid")
    assert "Loading weights" not in result.stderr


EVAL_BAD = [
    ("sampling.temperature=0", "sampling.temperature=0"), ("sampling.top_p=2", "(0, 1]"),
    ("sampling.n=-1", "sampling.n"), ("sampling.n=two", "sampling.n=two"),
    ("sampling.batch_size=0", "sampling.batch_size"),
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


def test_the_eval_defaults_pass():
    from rlx.evaluation.runner import check_settings as check_eval

    check_eval(check_overrides([], config_name="eval"))


def test_data_prefs_knobs_are_typed_too():
    from rlx.cli.data_prefs import build

    for override, start in (("samples_per_prompt=1", "samples_per_prompt=1 is not valid: it must be an integer >= 2"),
                            ("progress=sometimes", "unknown progress 'sometimes'; valid choices: auto, true, false"),
                            ("+pairs=2", "unknown key 'pairs'")):
        with pytest.raises(UserError) as info:
            build(check_overrides([override], config_name="data_prefs"))  # stops before any model loads
        assert str(info.value).startswith(start)
    assert "`rlx data prefs --help`" in str(info.value)


def test_data_prefs_samples_with_a_model_presets_tuning():
    # `rlx data prefs model=smollm2-135m-instruct` at the tiny model's sampling and tag verifier made 0 pairs
    from omegaconf import OmegaConf

    from rlx.config.paths import CONF_DIR

    tuning = OmegaConf.load(CONF_DIR / "tuning" / "smollm2-135m-instruct.yaml")
    per_task = OmegaConf.load(CONF_DIR / "tuning" / "smollm2-135m-instruct" / "chain_sum.yaml")
    cfg = check_overrides(["model=smollm2-135m-instruct"], config_name="data_prefs")
    drop_train_tuning(cfg, "data_prefs")
    check_config(cfg, "data_prefs")  # the tuning's keys for rlx train alone (steps, eval) are gone
    assert "steps" in tuning and "steps" not in cfg and "eval" not in cfg
    assert cfg.rollout.temperature == tuning.rollout.temperature != 1.0
    assert cfg.data.task_config.max_terms == per_task.data.task_config.max_terms  # the per-task tuning applies
    assert cfg.data.prompt_template == "{question}" and cfg.reward.components.task.reader == "final_number"
    given = check_overrides(["model=smollm2-135m-instruct", "rollout.temperature=0.3"], config_name="data_prefs")
    assert given.rollout.temperature == 0.3  # the command line still wins


def test_eval_of_a_model_preset_asks_and_scores_as_its_training_does():
    # `rlx eval model=smollm2-135m-instruct` used eval.yaml's tiny-model defaults: the tag verifier, temperature 1
    from omegaconf import OmegaConf

    from rlx.config.schema import apply_benchmark_tuning

    train = check_overrides(["model=smollm2-135m-instruct"], config_name="train")
    for benchmarks in (["benchmark=chain_sum"], ["benchmark=[chain_sum,gsm8k]"]):
        cfg = check_overrides(["model=smollm2-135m-instruct", *benchmarks], config_name="eval")
        drop_train_tuning(cfg, "eval")
        merged = apply_benchmark_tuning(cfg, "smollm2-135m-instruct")
        check_config(cfg, "eval")
        assert merged == ["tuning/smollm2-135m-instruct/benchmark_chain_sum.yaml"]
        assert "steps" not in cfg and "reward" not in cfg
        spec = OmegaConf.to_container(cfg.benchmark.chain_sum, resolve=True)
        assert spec["verifier"] == train.data.verifier  # what training scored, read where training read it
        assert cfg.model.answer.reader == train.reward.components.task.reader == "final_number"  # not the tag
        assert spec["data"]["prompt_template"] == train.data.prompt_template
        assert spec["data"]["task_config"] == OmegaConf.to_container(train.data.task_config)
        assert spec["max_new_tokens"] == train.rollout.max_new_tokens
        assert cfg.sampling.temperature == train.rollout.temperature == 0.7
    tiny = check_overrides([], config_name="eval")
    assert apply_benchmark_tuning(tiny, "tiny") == [] and tiny.benchmark.chain_sum.verifier == "reasoning_gym"


def test_a_model_presets_lora_learning_rate_applies_only_with_lora():
    # model=smollm2-135m-instruct model.lora.enabled=true trained at the full fine-tune's 1e-5: adapters barely moved
    rates = {}
    for extra in ([], ["model.lora.enabled=true"], ["model.lora.enabled=true", "optim.lr=3e-4"]):
        for model in ("tiny", "smollm2-135m-instruct"):
            cfg = check_overrides([f"model={model}", *extra], config_name="train")
            rates[model, tuple(extra)] = cfg.optim.lr
    assert rates["smollm2-135m-instruct", ()] == 1e-5
    assert rates["smollm2-135m-instruct", ("model.lora.enabled=true",)] == 2e-4  # the preset's model.lora.lr
    assert rates["tiny", ()] == rates["tiny", ("model.lora.enabled=true",)] == 1e-4  # no lora.lr: model.lr
    assert rates["smollm2-135m-instruct", ("model.lora.enabled=true", "optim.lr=3e-4")] == 3e-4  # the command line wins
