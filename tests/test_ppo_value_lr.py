"""The PPO critic's learning rate follows the policy's (optim.lr, which each model preset sets)."""

import pytest

from rlx.config.overrides import check_overrides
from rlx.models.value import value_learning_rate


def test_value_lr_is_a_ratio_of_the_policy_lr_unless_set():
    assert value_learning_rate(None, 5.0, 1e-6) == pytest.approx(5e-6)
    assert value_learning_rate(None, 10.0, 1e-4) == pytest.approx(1e-3)
    assert value_learning_rate(2e-5, 5.0, 1e-6) == 2e-5  # an explicit value_lr wins


@pytest.mark.parametrize("model,expected",
                         [("tiny", 5e-4), ("qwen2.5-0.5b-instruct", 5e-6), ("llama-3.2-1b-instruct", 5e-6)])
def test_presets_give_the_critic_a_rate_of_their_size(model, expected):
    """The tiny model's critic keeps the rate it was tuned with (5e-4); a real model's is no longer 500x its
    policy's."""
    algo = check_overrides(["algorithm=ppo", f"model={model}"])
    cfg = algo.algorithm
    assert value_learning_rate(cfg.value_lr, cfg.value_lr_ratio, algo.optim.lr) == pytest.approx(expected)


def test_ppo_loop_builds_the_critic_optimizer_at_that_rate(tmp_path, monkeypatch):
    """The loop itself: the value model's AdamW gets ratio x optim.lr (stopped right after the optimizers are built)."""
    import rlx.build as build
    import rlx.loops.ppo as ppo
    from tests.loop_fixtures import components, rows, run_loop, scored_by, tiny_policy

    built = []

    def capture(model, total, **settings):
        built.append(float(settings["lr"]))
        if len(built) == 2:
            raise StopIteration
        return real(model, total, **settings)

    real = build.build_optimizer
    monkeypatch.setattr(build, "build_optimizer", capture)
    model, tokenizer = tiny_policy()
    cfg = check_overrides(["algorithm=ppo", "optim.lr=2e-4", "algorithm.value_lr_ratio=3", "save.final=false"])
    with pytest.raises(StopIteration):
        run_loop(ppo.train_ppo, cfg, components(tmp_path, model, tokenizer, rows(["What is 3 + 4?"]), scored_by({})))
    assert built == [pytest.approx(2e-4), pytest.approx(6e-4)]  # policy, then critic
