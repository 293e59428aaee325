"""rlx.build.build_parts: the one builder of every part a loop starts from, declared per family (NEEDS)."""

import pytest
import torch

from rlx.build import FAMILIES, NEEDS, build_parts
from rlx.config.settings import checked_settings
from rlx.config.settings import settings as typed_settings
from rlx.loops.common import NoReference
from rlx.models.lora import AdapterDisabled, prepare_policy
from tests.loop_fixtures import (
    components,
    loop_config,
    one_thread,  # noqa: F401 (fixture)
    rows,
    scored_by,
    tiny_policy,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def _storages(module) -> set[int]:
    return {p.data_ptr() for p in module.parameters()}


def _built(tmp_path, *overrides):
    cfg = loop_config("save.final=false", *overrides)
    model, tokenizer = tiny_policy()
    model = prepare_policy(model, cfg.model, cfg.hardware)
    parts = build_parts(typed_settings(cfg),
                        components(tmp_path, model, tokenizer, rows(["What is 3 + 4?"]), scored_by({})))
    parts.checkpointer.close()  # gives back the signal handlers it installed
    return parts


def test_every_family_declares_what_it_needs():
    assert set(NEEDS) == set(FAMILIES)


def test_ppo_with_lora_keeps_no_reference_copy(tmp_path):
    """The README's promise: under LoRA the reference is the base with the adapter off, not a second
    model; every weight the reference computes with is one of the policy's own tensors."""
    parts = _built(tmp_path, "algorithm=ppo", "algorithm.kl_coef=0.05", "model.lora.enabled=true")
    assert isinstance(parts.reference, AdapterDisabled)
    assert _storages(parts.reference) <= _storages(parts.model)
    # the critic is a separate backbone (with its own adapter), never the reference
    assert not _storages(parts.critic.model) & _storages(parts.model)


def test_full_policy_gets_a_frozen_copy_and_none_without_kl(tmp_path):
    parts = _built(tmp_path, "algorithm=grpo", "algorithm.kl_coef=0.05")
    assert not _storages(parts.reference) & _storages(parts.model)
    assert not any(p.requires_grad for p in parts.reference.parameters())
    for a, b in zip(parts.reference.parameters(), parts.model.parameters()):
        assert torch.equal(a, b)  # the starting policy
    assert isinstance(_built(tmp_path / "b", "algorithm=grpo", "algorithm.kl_coef=0").reference, NoReference)


def test_schedules_go_to_prepare_or_to_the_checkpointer_as_declared(tmp_path):
    """Checkpoints hold an unprepared schedule as a registered object, so the family's choice must stay
    fixed (a resumed run reads the files an earlier run wrote)."""
    ppo = _built(tmp_path, "algorithm=ppo")
    assert list(ppo.checkpointed) == ["scheduler", "value_scheduler"]
    assert ppo.critic.optimizer is not None and ppo.run_eval is not None
    grpo = _built(tmp_path / "b", "algorithm=grpo")
    assert grpo.checkpointed == {} and not hasattr(grpo, "critic")


def test_every_family_has_its_cross_field_rules_in_one_module():
    """rlx/config/rules.py holds the rules; FAMILY_CHECKS says which apply to which family, so a family's
    rules run for it (and only for it) without an if/elif on the family name."""
    from rlx.config.overrides import check_overrides
    from rlx.config.rules import FAMILY_CHECKS, check_settings
    from rlx.errors import UserError

    assert set(FAMILY_CHECKS) == set(FAMILIES)
    with pytest.raises(UserError, match="algorithm=agent_sft imitates demonstrations in an environment: add env=grid"):
        check_settings(checked_settings(check_overrides(["algorithm=agent_sft"])))
    with pytest.raises(UserError, match="algorithm.advantage=gae needs a value model: use algorithm=ppo"):
        check_settings(checked_settings(check_overrides(["algorithm=grpo", "algorithm.advantage=gae"])))
    # the policy-gradient loop applies it
    check_settings(checked_settings(check_overrides(["algorithm=grpo", "rollout=vllm", "rollout.tis_cap=2"])))
    # and PPO (its correction)
    check_settings(checked_settings(check_overrides(["algorithm=ppo", "rollout=vllm", "rollout.tis_cap=2"])))
    check_settings(checked_settings(check_overrides(["algorithm=agent_sft", "env=grid", "hardware=ddp",
                                                     "hardware.num_processes=2"])))
    # data-parallel
    check_settings(checked_settings(check_overrides(["algorithm=gigpo", "env=grid", "hardware=ddp",
                                                     "hardware.num_processes=2"])))
