"""Variants are chosen from registries (issue 15; one `rlx.registry.Registry` type with decorators, issue 26): a
registry is a read-only Mapping in registration order, the names a config may use are the registry's names when
the config is checked (a plugin's entry included), and every shipped preset names a registered entry."""

import pytest
import torch

from rlx.algorithms import advantages, gigpo, kl, losses, preference
from rlx.config.overrides import check_overrides
from rlx.config.paths import group_options
from rlx.config.rules import check_settings
from rlx.config.settings import checked_settings
from rlx.errors import UserError
from rlx.registry import Registry, RegistryView, UnknownName


@pytest.fixture
def registered():
    """registered(registry, name, entry): add an entry for this test only (removed afterwards)."""
    added = []

    def add(registry, name, entry):
        registry.register(name)(entry)
        added.append((registry, name))
        return entry

    yield add
    for registry, name in reversed(added):
        registry.unregister(name)


def test_the_built_in_names_and_their_order_are_kept():
    """The names (and their order, which error messages list) the dict registries had before decorators."""
    from rlx.data.tasks import DATA_SOURCES
    from rlx.envs import ENVIRONMENTS
    from rlx.tasks import VERIFIERS

    assert list(advantages.ESTIMATORS) == ["grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "median", "ngrpo",
                                           "gae"]
    assert list(advantages.OUTCOME_ESTIMATORS) == list(advantages.ESTIMATORS)[:-1]
    assert list(advantages.SCALES) == ["group", "batch", "none", "mad"]
    assert list(kl.KL_ESTIMATORS) == ["k1", "k2", "k3"] and list(kl.KL_PLACEMENTS) == ["loss", "reward"]
    assert list(losses.LOSS_AGGREGATIONS) == ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                                              "seq-mean-token-sum-norm"]
    assert list(losses.RATIO_LEVELS) == ["token", "sequence"]
    assert list(preference.PREFERENCE_LOSSES) == ["dpo", "cdpo", "robust", "ipo", "hinge", "simpo", "orpo"]
    assert sorted(preference.REFERENCE_FREE) == ["orpo", "simpo"]
    assert list(gigpo.CREDIT) == ["trajectory", "gigpo", "turn", "loo", "gra", "hgpo"]
    assert list(gigpo.SCALES) == ["group", "none"]
    assert list(VERIFIERS) == ["exact", "numeric", "final_number", "math", "reasoning_gym", "unit_tests"]
    assert VERIFIERS["unit_tests"].needs == ("prompt", "test", "entry_point")
    assert VERIFIERS["reasoning_gym"].needs == ("answer", "question", "task", "metadata")
    assert list(ENVIRONMENTS) == ["guess_number", "grid", "corridor", "tool_use", "mixture"]
    assert list(DATA_SOURCES) == ["reasoning_gym", "file", "hub"]
    # the older names still reach the same registries
    assert advantages.SCALE_REGISTRY is advantages.SCALES and kl.KL_ESTIMATOR_REGISTRY is kl.KL_ESTIMATORS
    assert losses.AGGREGATIONS is losses.LOSS_AGGREGATIONS and gigpo.SCALE_REGISTRY is gigpo.SCALES


def test_a_registry_reads_like_a_dict_and_refuses_item_assignment():
    registry = Registry("widget")

    @registry.register("b")
    def b():
        return "b"

    assert registry.register("a")(len) is len  # the decorator returns what it decorates
    assert list(registry) == ["b", "a"] and list(registry.keys()) == ["b", "a"] and len(registry) == 2
    assert dict(registry.items()) == {"b": b, "a": len} and registry.get("c") is None and "b" in registry
    with pytest.raises(KeyError):  # Mapping semantics
        registry["c"]
    with pytest.raises(ValueError, match=r"^unknown widget 'c'; valid choices: b, a$"):  # callers that catch ValueError
        registry["c"]
    with pytest.raises(TypeError, match="read-only.*register"):
        registry["c"] = len
    with pytest.raises(ValueError, match=r"widget 'a' is registered twice \(already by builtins.len\)"):
        registry.register("a")(b)
    registry.unregister("a")
    assert list(registry) == ["b"]


def test_the_same_definition_again_replaces_itself_another_one_is_refused():
    """A notebook cell run twice, or a reloaded plugin, defines the same function again (same module and name):
    it replaces itself instead of failing; a different definition under a taken name is refused."""
    registry = Registry("widget")
    namespace: dict = {"__name__": "my_notebook"}
    source = "def score(x):\n    return x\n"
    exec(source, namespace)
    registry.register("score")(namespace["score"])
    exec(source, namespace)  # the cell again
    registry.register("score")(namespace["score"])
    assert registry["score"] is namespace["score"]
    with pytest.raises(ValueError, match=r"registered twice \(already by my_notebook.score\)"):
        registry.register("score")(len)


def test_a_view_joins_registries_live():
    first, second = Registry("first"), Registry("second")
    first.register("a")(len)
    view = RegistryView("thing", first, second)
    second.register("b")(abs)
    assert list(view) == ["a", "b"] and view["b"] is abs and "b" in view and len(view) == 2
    with pytest.raises(UnknownName, match="^unknown thing 'c'; valid choices: a, b$"):
        view["c"]


def test_more_variants_are_found_by_name(monkeypatch, registered):
    """Schedules, ratio levels, KL placements, agent scales and preference-pair sources: a new entry
    is used by name, and an unknown name is refused with the registry's keys."""
    from rlx.data import preferences
    from rlx.runtime import optim as common

    monkeypatch.setitem(common.SCHEDULES, "half", lambda progress: 0.5)  # the loops' dict (rlx/loops/common.py)
    assert common.lr_lambda("half", 0, 10)(3) == 0.5
    with pytest.raises(ValueError, match="valid choices: constant, cosine, linear, half"):
        common.lr_lambda("step", 0, 10)
    logp, old, mask = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]]), torch.ones(1, 2)
    registered(losses.RATIO_LEVELS, "one", lambda logp, old_logp, mask: torch.ones_like(logp))
    assert losses.importance_ratio(logp, old, mask, "one").tolist() == [[1.0, 1.0]]
    registered(kl.KL_PLACEMENTS, "twice", lambda loss, k, m, c: loss + 2 * c * k * m)
    out, k = kl.penalized_token_loss(torch.zeros(1, 2), logp, old, torch.zeros(1, 2), mask, 0.5,
                                    kl.PenaltyTerms("k1", "twice", 0.0))
    assert torch.allclose(out, k)  # 2 x 0.5 x KL
    registered(gigpo.SCALES, "double", lambda std, eps: 0.5)
    grouped = gigpo.grouped_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), "double")
    assert grouped.tolist() == [1.0, -1.0]  # (r - 0.5) / 0.5
    monkeypatch.setitem(preferences.PAIR_SOURCES, "inline", lambda cfg, columns, stats: (["train"], ["held"]))
    from omegaconf import OmegaConf

    assert preferences.load_pairs(OmegaConf.create({"source": "inline", "columns": {}, "eval_size": 5}),
                                  0)[:2] == (["train"], ["held"])


def test_an_agent_scale_reaches_the_agent_credit_rules_too(registered):
    """loo/gra/hgpo group with the same scale registry as GiGPO: hgpo with depth 0 is GiGPO, so both give the
    same advantages under a scale added at run time. Episodes [1] and [0] of one task, one anchored step each
    (the same anchor): episode level (R - 0.5) / 0.5 = [1, -1]; the step level the same, weighted 1 -> [2, -2]."""
    registered(gigpo.SCALES, "half", lambda std, eps: 0.5)
    from rlx.algorithms.agent_credit import HGPOSettings, hgpo_advantages

    args = torch.tensor([0, 0]), torch.tensor([0, 1]), torch.tensor([1.0, 0.0]), torch.tensor([3, 3])
    via_gigpo, _ = gigpo.gigpo_advantages(*args, scale="half")
    via_hgpo, _ = hgpo_advantages(*args, settings=HGPOSettings(hgpo_depth=0, scale="half"))
    assert via_gigpo.tolist() == [2.0, -2.0] and via_hgpo.tolist() == [2.0, -2.0]


@pytest.mark.parametrize("option", group_options("algorithm"))
def test_every_preset_names_registered_variants(option):
    algo = check_overrides([f"algorithm={option}"]).algorithm
    if algo.family == "preference":
        assert algo.loss_type in preference.PREFERENCE_LOSSES
    if algo.family == "policy_gradient":  # PPO's gae has no scale
        assert algo.scale in advantages.SCALES
    if algo.family in ("policy_gradient", "ppo"):
        assert algo.advantage in advantages.ESTIMATORS
        assert algo.loss_agg in losses.AGGREGATIONS and algo.kl_estimator in kl.KL_ESTIMATOR_REGISTRY


def test_a_registered_variant_is_used_by_name(registered):
    """A new entry is all it takes: the dispatcher finds it by name (no if/elif to extend)."""
    registered(kl.KL_ESTIMATORS, "abs", lambda x: x.abs())
    out = kl.kl_penalty(torch.tensor([[0.0, -1.0]]), torch.tensor([[0.5, 0.0]]), "abs")
    assert out.tolist() == [[0.5, 1.0]]
    registered(preference.REFERENCE_LOSSES, "double_dpo", lambda h, beta,
               label_smoothing: 2 * preference.dpo_loss(h, beta))
    args = [torch.tensor([-1.0]), torch.tensor([-2.0]), torch.tensor([-1.5]), torch.tensor([-1.5])]
    double, _ = preference.preference_loss(*args, loss_type="double_dpo", beta=0.1)
    single, _ = preference.preference_loss(*args, loss_type="dpo", beta=0.1)
    assert torch.allclose(double, 2 * single)


def test_an_estimator_returning_advantages_alone_keeps_every_sample(registered):
    """rewards [1, 0, 0, 1] in groups of 2: r - mean(group) = [0.5, -0.5, -0.5, 0.5]; no keep mask returned,
    so every sample enters the loss."""
    from rlx.algorithms.grouping import group_mean

    registered(advantages.OUTCOME_ESTIMATORS, "centred", lambda rewards, group_ids,
               **knobs: rewards - group_mean(rewards, group_ids))
    adv, keep, metrics = advantages.outcome_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.tensor([4, 4, 9, 9]),
                                                       "centred")
    assert adv.tolist() == [0.5, -0.5, -0.5, 0.5] and keep.tolist() == [True] * 4 and metrics == {}


LIVE = [  # (kind's registry, name, entry, overrides naming it, the message once it is gone)
    ("advantage", ["algorithm.advantage=tmp"], "unknown algorithm.advantage 'tmp'; valid choices: grpo, rloo, "
     "reinforce_pp, reinforce_pp_baseline, median, ngrpo, gae"),
    ("credit", ["algorithm=gigpo", "env=grid", "algorithm.credit=tmp"],
     "unknown algorithm.credit 'tmp'; valid choices: "
     "trajectory, gigpo, turn, loo, gra, hgpo"),
    ("verifier", ["data.verifier=tmp"],
     "unknown data.verifier 'tmp'; valid choices: exact, numeric, final_number, math, "
     "reasoning_gym, unit_tests, null"),
    ("env", ["algorithm=gigpo", "env=custom", "env.name=tmp"], "unknown env.name 'tmp'; valid choices: guess_number, "
     "grid, corridor, tool_use, mixture, custom, harness"),
    ("reward_shaper", ["algorithm.shapers=[tmp]"],
     "unknown algorithm.shapers entry 'tmp'; valid choices: laser, laser_d, "
     "concise, unlikeliness, noise_backward, par, win_rate"),
]


@pytest.mark.parametrize("kind,overrides,refused", LIVE, ids=[k for k, _, _ in LIVE])
def test_a_name_is_checked_against_the_live_registry(kind, overrides, refused):
    """Registered after the schema module was imported (as a plugin does), the name is valid; unregistered, the
    check refuses it in one line listing the registry's names at that moment."""
    from rlx.cli.registries import KINDS
    from rlx.config.schema import check_config

    registry = KINDS[kind].registry
    registry.add("tmp", registry[next(iter(registry))])  # any entry's object will do for the check
    try:
        check_config(check_overrides(overrides))
    finally:
        registry.unregister("tmp")
    with pytest.raises(UserError) as info:
        check_settings(checked_settings(check_overrides(overrides)))
    assert str(info.value) == refused


def test_rlx_register_names_its_kinds_and_refuses_taken_names():
    import rlx
    from rlx.cli.registries import KINDS
    from rlx.tasks import VERIFIERS, answer_tag_or_boxed

    with pytest.raises(ValueError) as info:
        rlx.register("advantages", "x")
    assert str(info.value) == f"unknown registry kind 'advantages'; valid kinds: {', '.join(KINDS)}"
    assert {"advantage", "scale", "credit", "loss_agg", "kl_estimator", "verifier", "env", "reward_shaper",
            "advantage_transform"} <= set(KINDS)
    with pytest.raises(ValueError, match=r"^outcome advantage estimator 'grpo' is registered twice \(already by "
                                         r"rlx.algorithms.advantages.grpo_estimator\); pick another name$"):
        rlx.register("advantage", "grpo")(lambda *a, **k: None)
    with pytest.raises(ValueError, match="takes no options"):
        rlx.register("advantage", "x", extract=len)
    with pytest.raises(ValueError, match=r"^a loss aggregation declares no needs"):
        rlx.register("loss_agg", "x", needs={"extra_samples": 1})(lambda *a, **k: None)

    def lower_case(extracted, problems):
        return [float(a is not None and a.lower() == p["answer"].lower()) for a, p in zip(extracted, problems)]

    assert rlx.register("verifier", "tmp_lower", extract=answer_tag_or_boxed)(lower_case) is lower_case
    try:
        assert VERIFIERS["tmp_lower"].score(["\\boxed{ABC}"], [{"answer": "abc"}]) == (["ABC"], [1.0])
    finally:
        VERIFIERS.unregister("tmp_lower")


def test_every_family_names_a_loop_that_exists():
    from rlx.build import FAMILIES, LOOPS

    assert FAMILIES == tuple(LOOPS)
    for family, loop in LOOPS.items():
        assert callable(loop) and loop.__module__.startswith("rlx.loops."), family
