"""Hand-derived numbers for the multi-turn credit assignment of rlx/algorithms/gigpo.py.

The shared batch (3 episodes, 6 steps), derived by hand in each test:
  episode 0 (task 0): anchors [0, 1],    rewards [0, 1]    return 1
  episode 1 (task 0): anchors [0, 0, 2], rewards [0, 0, 0] return 0
  episode 2 (task 1): anchors [0],       rewards [1]       return 1 (alone in its task group)
"""

import pytest
import torch

from rlx.algorithms.gigpo import (
    CREDIT,
    discounted_returns,
    gigpo_advantages,
    grouped_advantages,
    invalid_action_penalty,
    trajectory_advantages,
    turn_advantages,
)

EPISODE_GROUP = torch.tensor([0, 0, 1])
STEP_EPISODE = torch.tensor([0, 0, 1, 1, 1, 2])
STEP_REWARDS = torch.tensor([0.0, 1.0, 0.0, 0.0, 0.0, 1.0])
STEP_ANCHOR = torch.tensor([0, 1, 0, 0, 2, 0])


def test_discounted_returns_restart_at_each_episode():
    # [0, 0, 1], gamma 0.5 -> [0.25, 0.5, 1]; then a new episode [1, 1] -> [1.5, 1]
    rewards = torch.tensor([0.0, 0.0, 1.0, 1.0, 1.0])
    episode = torch.tensor([0, 0, 0, 1, 1])
    assert torch.allclose(discounted_returns(rewards, episode, 0.5), torch.tensor([0.25, 0.5, 1.0, 1.5, 1.0]))


def test_grouped_advantages_by_id_with_singletons():
    # group 7: [1, 0, 2] mean 1, unbiased std 1 -> [0, -1, 1]; group 3 alone -> 0
    values = torch.tensor([1.0, 0.0, 5.0, 2.0])
    groups = torch.tensor([7, 7, 3, 7])
    assert torch.allclose(grouped_advantages(values, groups, "group", eps=0.0), torch.tensor([0.0, -1.0, 0.0, 1.0]))
    assert torch.allclose(grouped_advantages(values, groups, "none"), torch.tensor([0.0, -1.0, 0.0, 1.0]))


def test_trajectory_advantages_give_every_step_its_episode_advantage():
    # task 0 returns [1, 0], mean 0.5 -> +0.5 / -0.5 (scale none); task 1 alone -> 0
    adv, _ = trajectory_advantages(EPISODE_GROUP, STEP_EPISODE, STEP_REWARDS, STEP_ANCHOR, scale="none")
    assert torch.allclose(adv, torch.tensor([0.5, 0.5, -0.5, -0.5, -0.5, 0.0]))


def test_gigpo_unscaled_hand_numbers():
    # A^E: ep0 +0.5, ep1 -0.5, ep2 0.  Discounted returns (gamma 0.5): ep0 [0.5, 1], ep1 [0, 0, 0], ep2 [1].
    # Step group (task 0, anchor 0) = {ep0 t0: 0.5, ep1 t0: 0, ep1 t1: 0}, mean 1/6 -> [1/3, -1/6, -1/6].
    # (task 0, anchor 1), (task 0, anchor 2) and (task 1, anchor 0) are singletons -> 0 (anchor 0 of task 1
    # must not join task 0's group).  A = A^E + A^S.
    adv, metrics = gigpo_advantages(EPISODE_GROUP, STEP_EPISODE, STEP_REWARDS, STEP_ANCHOR, gamma=0.5, scale="none")
    expected = torch.tensor([0.5 + 1 / 3, 0.5, -0.5 - 1 / 6, -0.5 - 1 / 6, -0.5, 0.0])
    assert torch.allclose(adv, expected)
    # step-group sizes over the 6 anchored steps: [3, 1, 3, 3, 1, 1] -> mean 2
    assert metrics["env/anchor_group_size"] == pytest.approx(2.0)
    # w = 0.5 halves only the step part: ep0 t0 = 0.5 + 1/6
    half, _ = gigpo_advantages(EPISODE_GROUP, STEP_EPISODE, STEP_REWARDS, STEP_ANCHOR, gamma=0.5, step_weight=0.5,
                               scale="none")
    assert half[0].item() == pytest.approx(0.5 + 1 / 6)


def test_gigpo_group_scaled_hand_numbers():
    # A^E: returns [1, 0], std 1/sqrt(2) -> +-0.5 * sqrt(2) = +-0.70711.
    # Step group [0.5, 0, 0]: deviations [1/3, -1/6, -1/6], squares 1/6, / (3 - 1) -> var 1/12, std 0.288675
    # -> A^S = [1.154701, -0.577350, -0.577350].
    adv, _ = gigpo_advantages(EPISODE_GROUP, STEP_EPISODE, STEP_REWARDS, STEP_ANCHOR, gamma=0.5, scale="group", eps=0.0)
    e = 0.5 * 2**0.5
    expected = torch.tensor([e + 1.154701, e, -e - 0.577350, -e - 0.577350, -e, 0.0])
    assert torch.allclose(adv, expected, atol=1e-5)


def test_gigpo_steps_without_anchor_get_only_the_episode_part():
    anchors = torch.full_like(STEP_ANCHOR, -1)
    adv, metrics = gigpo_advantages(EPISODE_GROUP, STEP_EPISODE, STEP_REWARDS, anchors, gamma=0.5, scale="none")
    assert torch.allclose(adv, torch.tensor([0.5, 0.5, -0.5, -0.5, -0.5, 0.0]))
    assert metrics["env/anchor_group_size"] == 0.0


def test_gigpo_direction_better_action_from_the_same_state_gets_more_credit():
    # Both episodes fail (equal returns: no episode signal), but from state 5, episode 0's action
    # led one step closer to a reward (discounted return 0.95^1 vs 0.95^2): its step advantage is positive.
    group = torch.tensor([0, 0])
    step_episode = torch.tensor([0, 0, 1, 1, 1])
    rewards = torch.tensor([0.0, 1.0, 0.0, 0.0, 1.0])
    anchors = torch.tensor([5, 6, 5, 7, 6])
    adv, _ = gigpo_advantages(group, step_episode, rewards, anchors, gamma=0.95)
    assert adv[0] > 0 > adv[2]


def test_turn_advantages_hand_numbers():
    # A^O = [+0.5, -0.5, 0] per episode (scale none).  Turn groups of task 0: turn 0 rewards [0, 0] -> 0, 0;
    # turn 1 [1, 0] -> +0.5, -0.5; turn 2 only ep1 -> 0.  Task 1 turn 0 alone -> 0.
    adv, _ = turn_advantages(EPISODE_GROUP, STEP_EPISODE, STEP_REWARDS, STEP_ANCHOR, turn_weight=1.0, scale="none")
    assert torch.allclose(adv, torch.tensor([0.5, 1.0, -0.5, -1.0, -0.5, 0.0]))
    adv2, _ = turn_advantages(EPISODE_GROUP, STEP_EPISODE, STEP_REWARDS, STEP_ANCHOR, turn_weight=2.0, scale="none")
    assert adv2[1].item() == pytest.approx(1.5)


def test_invalid_action_penalty():
    rewards = torch.tensor([1.0, 0.0, 0.5])
    valid = torch.tensor([True, False, False])
    assert torch.allclose(invalid_action_penalty(rewards, valid, 0.1), torch.tensor([1.0, -0.1, 0.4]))


def test_registry_names():
    assert set(CREDIT) == {"trajectory", "gigpo", "turn", "loo", "gra", "hgpo"}  # the last three: agent_credit.py
    with pytest.raises(ValueError, match="valid choices"):
        grouped_advantages(torch.ones(2), torch.zeros(2, dtype=torch.long), "batch")
