"""Group reward shaping: rewards reshaped with the whole group in view, before the advantage estimator.

Reward components (rlx/rewards) score one completion at a time; the shapers here see every sample of
the batch with its group id, correctness, length and (when asked) its mean log-prob, so they can gate
a length bonus on correctness, rank samples within their group, or correct a noisy verifier.

    SHAPERS[name](rewards (N,), signals: GroupSignals, **knobs) -> (rewards (N,), metrics)

`apply_shapers(names, rewards, signals, knobs)` runs them in the configured order
(`algorithm.shapers`). Each shaper ignores the knobs that are not its own. The formulas, their papers
and where rlx departs are in each docstring and in docs/algorithms/seed-ideas.md. Torch only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from rlx.algorithms.grouping import group_all, group_mean, group_rank, group_size
from rlx.registry import Registry


@dataclass
class GroupSignals:
    """What a shaper or advantage transform may look at besides the rewards. All (N,) unless noted.

    groups: group id of each sample (equal id = same prompt; any sizes).
    correct: the verifier's verdict (the accuracy component reached its full value), bool; None: no verifier.
    lengths: completion tokens.
    mean_logp: mean token log-prob of the completion under the policy that sampled it (the old log-probs).
    reference_rewards: (N, M) reward-model scores of M reference responses to the sample's prompt (PAR).
    accuracy_weight: weight of the verifier component inside the total reward.
    max_length: the generation budget (rollout.max_new_tokens).
    step: the training step (schedules)."""

    groups: torch.Tensor
    correct: torch.Tensor | None = None
    lengths: torch.Tensor | None = None
    mean_logp: torch.Tensor | None = None
    reference_rewards: torch.Tensor | None = None
    accuracy_weight: float = 1.0
    max_length: int | None = None
    step: int = 0

    def need(self, name: str, who: str) -> torch.Tensor:
        value = getattr(self, name)
        if value is None:
            raise ValueError(f"{who} needs per-sample {name}, which this batch does not carry")
        return value


def correct_from_accuracy(accuracy: torch.Tensor, full: float = 1.0) -> torch.Tensor:
    """The verifier's verdict from the accuracy component: at least `full` (NaN: not scored -> False)."""
    return torch.nan_to_num(accuracy.double(), nan=-math.inf) >= full - 1e-9


@dataclass(frozen=True)
class ShaperNeeds:
    """What a reward shaper asks of the run, declared at registration and read by generic code (the config's check,
    rlx/config/needs.py; the producer's group stages, rlx/rollout/stages/shaping.py). The defaults ask for nothing."""

    # (algorithm.shaping knob that must be set, what it holds): laser_d's budgets
    knobs: tuple[tuple[str, str], ...] = ()
    rates_below_one: tuple[str, ...] = ()  # algorithm.shaping rates whose sum must be below 1 (noise_backward)
    affine: bool = False                 # an affine map of the verifier's binary reward: standardisation cancels it
    length_targets: bool = False         # per-difficulty length targets the loop adapts (LaserDTargets, laser_d)
    reference_rewards: bool = False      # the reward of each row's reference completion (data.completion_template)


SHAPERS = Registry("reward shaper", default_needs=ShaperNeeds())


def apply_shapers(names, rewards: torch.Tensor, signals: GroupSignals, knobs: dict) -> tuple[torch.Tensor, dict]:
    """Run the named shapers in order, each on the previous one's output. Returns rewards (N,), metrics."""
    metrics: dict = {}
    for name in names:
        rewards, shaper_metrics = SHAPERS[name](rewards, signals, **knobs)
        metrics.update(shaper_metrics)
    return rewards, metrics


def _correct_lengths(correct: torch.Tensor, lengths: torch.Tensor) -> dict:
    chosen = lengths[correct.bool()].double()
    return {"shaping/correct_mean_length": chosen.mean().item() if chosen.numel() else None}


# ---------------------------------------------------------------------------------------------------
# Length shaping gated on correctness: LASER, LASER-D, ConciseR
# ---------------------------------------------------------------------------------------------------


def laser_rewards(rewards: torch.Tensor, correct: torch.Tensor, lengths: torch.Tensor, target,
                  alpha: float) -> torch.Tensor:
    """LASER (Liu et al. 2025, "Learn to Reason Efficiently with Adaptive Length-based Reward Shaping",
    arXiv 2505.15612): R(y) = C(y) + lambda(y) S(y) with S = alpha 1[L(y) <= L_T] and lambda = 1[correct],
    the step reward of the authors' code (hkust-nlp/Laser, length_penalty.py, length_reward_type "reward",
    alpha = length_reward_scalar 0.5). Wrong answers keep their reward whatever their length.
    target: L_T, a number or (N,) per-sample targets (LASER-D). rewards, correct, lengths: (N,)."""
    within = lengths.double() <= torch.as_tensor(target, dtype=torch.float64)
    return rewards + alpha * (correct.bool() & within).to(rewards.dtype)


@SHAPERS.register("laser")
def laser_shaping(rewards, signals: GroupSignals, *, length_alpha: float = 0.5, target_tokens: int = 16, **_):
    correct, lengths = signals.need("correct", "shaper laser"), signals.need("lengths", "shaper laser")
    shaped = laser_rewards(rewards, correct, lengths, target_tokens, length_alpha)
    return shaped, {"shaping/length_bonus_frac": (shaped != rewards).double().mean().item(),
                    **_correct_lengths(correct, lengths)}


DIFFICULTY_BUCKETS = ("easy", "medium", "hard")


def difficulty_buckets(correct: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """(N,) long bucket of each sample's prompt by its group pass rate p (LASER-D, the authors' bands):
    0 easy (p >= 2/3), 1 medium (1/3 <= p < 2/3), 2 hard (p < 1/3)."""
    rate = group_mean(correct.double(), groups)
    return torch.where(rate >= 2 / 3, 0, torch.where(rate >= 1 / 3, 1, 2))


def laser_d_targets(lengths: torch.Tensor, correct: torch.Tensor, groups: torch.Tensor, candidates,
                    samples_per_prompt: int, expected_correct: int = 1, fallback: int | None = None) -> torch.Tensor:
    """LASER-D's per-bucket targets (Liu et al. 2025; the authors' code, ray_trainer.py
    _count_accuracy_bands_metrics and length_penalty.py _choose_target_length, round_method "floor"):
    for bucket b, coverage_b(L) = the fraction of the bucket's responses (all of them, correct or not)
    of at most L tokens; with n = samples_per_prompt, the bucket guarantees at least lower_n correct
    responses per prompt (floor(2n/3) easy, floor(n/3) medium, 1 hard), and the target is the smallest
    candidate L with floor(coverage_b(L) * lower_n) >= expected_correct: the shortest budget under which
    the expected number of correct responses kept within budget is still `expected_correct`.
    A bucket with no prompt, or no qualifying candidate, keeps `fallback` (default: the largest candidate).
    rlx departs: the authors measure coverage on a monitoring set every K steps; rlx's hook measures it
    on the training batch (no extra generation, held-out data untouched). Returns (3,) long targets."""
    candidates = sorted(int(c) for c in candidates)
    fallback = candidates[-1] if fallback is None else int(fallback)
    buckets = difficulty_buckets(correct, groups)
    lower = (int(samples_per_prompt * 2 / 3), int(samples_per_prompt / 3), 1)
    targets = torch.full((3,), fallback, dtype=torch.long)
    for bucket in range(3):
        chosen = lengths[buckets == bucket].double()
        if chosen.numel() == 0:
            continue
        for budget in candidates:
            coverage = (chosen <= budget).double().mean().item()
            if int(coverage * lower[bucket]) >= expected_correct:
                targets[bucket] = min(budget, fallback)
                break
    return targets


class LaserDTargets:
    """LASER-D's adaptive state: one target length per difficulty bucket, recomputed every `adapt_every`
    steps by `laser_d_targets` (before the first update: `initial` everywhere). Checkpointed exactly
    (state_dict / load_state_dict), so a resumed run shapes as the uninterrupted one would."""

    def __init__(self, initial: int, candidates, samples_per_prompt: int, adapt_every: int, expected_correct: int = 1):
        self.targets = torch.full((3,), int(initial), dtype=torch.long)
        self.candidates, self.samples_per_prompt = [int(c) for c in candidates], samples_per_prompt
        self.adapt_every, self.expected_correct = adapt_every, expected_correct
        self.updated_at = 0

    def update(self, step: int, lengths, correct, groups) -> bool:
        """Recompute on this batch when `step` is a multiple of adapt_every; True when it did."""
        if self.adapt_every < 1 or step % self.adapt_every:
            return False
        self.targets = laser_d_targets(lengths, correct, groups, self.candidates, self.samples_per_prompt,
                                       self.expected_correct)
        self.updated_at = step
        return True

    def state_dict(self) -> dict:
        return {"targets": self.targets.tolist(), "updated_at": self.updated_at}

    def load_state_dict(self, state: dict) -> None:
        self.targets = torch.tensor(state["targets"], dtype=torch.long)
        self.updated_at = int(state["updated_at"])


@SHAPERS.register("laser_d", needs=ShaperNeeds(knobs=(("target_candidates", "budgets to try"),),
                                                          length_targets=True))
def laser_d_shaping(rewards, signals: GroupSignals, *, length_alpha: float = 0.5, bucket_targets=(16, 16, 16), **_):
    """LASER-D: LASER with L_T = the target of the prompt's difficulty bucket (`difficulty_buckets`);
    bucket_targets (easy, medium, hard) come from LaserDTargets, which the loop updates."""
    correct, lengths = signals.need("correct", "shaper laser_d"), signals.need("lengths", "shaper laser_d")
    targets = torch.as_tensor(list(bucket_targets), dtype=torch.long)[difficulty_buckets(correct, signals.groups)]
    shaped = laser_rewards(rewards, correct, lengths, targets, length_alpha)
    metrics = {"shaping/length_bonus_frac": (shaped != rewards).double().mean().item(),
               **_correct_lengths(correct, lengths)}
    metrics.update({f"shaping/laser_target_{name}": int(t) for name, t in zip(DIFFICULTY_BUCKETS, bucket_targets)})
    return shaped, metrics


def concise_rewards(rewards: torch.Tensor, correct: torch.Tensor, lengths: torch.Tensor, groups: torch.Tensor,
                    max_length: int, alpha: float) -> torch.Tensor:
    """ConciseR's gate (Song & Zheng 2025, "Walk Before You Run! Concise LLM Reasoning via RL", arXiv
    2505.21178): the length term applies only when ALL rollouts of the prompt are correct.
        r'_i = r_i + alpha * 1[every sample of group(i) correct] * (1 - L_i / L_max)
    The gate is the paper's; the linear term 1 - L/L_max (L_max = the generation budget) is rlx's choice,
    the paper's exact L-GRPO length reward was not checked. (N,) each."""
    gate = group_all(correct, groups)
    bonus = (1.0 - lengths.double() / float(max_length)).clamp(min=0.0)
    return rewards + alpha * (gate.double() * bonus).to(rewards.dtype)


@SHAPERS.register("concise")
def concise_shaping(rewards, signals: GroupSignals, *, length_alpha: float = 0.5, **_):
    correct, lengths = signals.need("correct", "shaper concise"), signals.need("lengths", "shaper concise")
    if signals.max_length is None:
        raise ValueError("shaper concise needs the generation budget (max_length)")
    shaped = concise_rewards(rewards, correct, lengths, signals.groups, signals.max_length, length_alpha)
    gated = group_all(correct, signals.groups)
    return shaped, {"shaping/concise_gated_frac": gated.double().mean().item(), **_correct_lengths(correct, lengths)}


# ---------------------------------------------------------------------------------------------------
# Rewarding the unlikely (pass@k)
# ---------------------------------------------------------------------------------------------------


def unlikeliness_rewards(rewards: torch.Tensor, mean_logp: torch.Tensor, groups: torch.Tensor,
                         beta: float) -> torch.Tensor:
    """Unlikeliness reward ("Rewarding the Unlikely: Lifting GRPO Beyond Distribution
    Sharpening"; the authors' code AndreHe02/rewarding-unlikely-release, ray_lean_trainer.py
    _compute_advantages, lean.rank_penalty = 0.25):
        rank_i = position of m_i in its group sorted ascending (0 = the LEAST likely sample)
        r'_i   = r_i * (1 - beta * rank_i / G)
    m_i is the mean token log-prob under the sampling-time policy, G the group's size. The most likely
    correct sample loses the most, so among correct samples the rare ones get the larger advantage after
    the group normalisation that follows (the authors apply GRPO's). Ties in m: earlier sample ranks
    lower (stable sort). rewards, mean_logp, groups: (N,)."""
    rank = group_rank(mean_logp, groups).to(rewards.dtype)
    return rewards * (1.0 - beta * rank / group_size(groups).to(rewards.dtype))


@SHAPERS.register("unlikeliness")
def unlikeliness_shaping(rewards, signals: GroupSignals, *, unlikeliness_beta: float = 0.25, **_):
    mean_logp = signals.need("mean_logp", "shaper unlikeliness")
    return unlikeliness_rewards(rewards, mean_logp, signals.groups, unlikeliness_beta), {}


# ---------------------------------------------------------------------------------------------------
# Noisy verifiers: injection (controlled studies) and the backward correction
# ---------------------------------------------------------------------------------------------------


def inject_verifier_noise(correct: torch.Tensor, fn_rate: float, fp_rate: float,
                          uniforms: torch.Tensor) -> torch.Tensor:
    """A noisy verifier for controlled studies (the channel of Cai et al. 2025, "Reinforcement Learning
    with Verifiable yet Noisy Rewards under Imperfect Verifiers", arXiv 2510.00915): a correct answer is
    rejected with probability rho_1 = fn_rate, a wrong one accepted with probability rho_0 = fp_rate.
    uniforms (N,) in [0, 1): one draw per sample from the counter-based seeding the sampler uses
    (engines/sampling.py row_uniforms of sample_seed), so the noise is reproducible and resumable.
    flip_i = u_i < rho_1 where correct, u_i < rho_0 where wrong. Returns the observed verdicts (N,) bool."""
    correct = correct.bool()
    flip = torch.where(correct, uniforms < fn_rate, uniforms < fp_rate)
    return correct ^ flip


def backward_correction(observed: torch.Tensor, fp_rate: float, fn_rate: float) -> torch.Tensor:
    """Backward correction (Cai et al. 2025): r_hat = (r_obs - rho_0) / (1 - rho_0 - rho_1), unbiased:
    E[r_hat | r* = 1] = ((1 - rho_1) - rho_0) / (1 - rho_0 - rho_1) = 1 and E[r_hat | r* = 0] = 0.
    Needs rho_0 + rho_1 < 1. observed: (N,) 0/1. It is an affine map with a positive slope: group or
    batch standardisation (GRPO, Lite PPO, REINFORCE++) cancels it exactly, and Dr. GRPO / RLOO only see
    the learning rate scaled by 1 / (1 - rho_0 - rho_1); it matters when the verifier reward is mixed
    with other components, under a critic, or with per-sample rates."""
    if fp_rate + fn_rate >= 1:
        raise ValueError(f"the noise rates must satisfy fp_rate + fn_rate < 1 (got {fp_rate} + {fn_rate})")
    return (observed.double() - fp_rate) / (1.0 - fp_rate - fn_rate)


@SHAPERS.register("noise_backward", needs=ShaperNeeds(rates_below_one=("assumed_fp_rate", "assumed_fn_rate"),
                                                      affine=True))
def noise_backward_shaping(rewards, signals: GroupSignals, *, assumed_fp_rate: float = 0.0,
                           assumed_fn_rate: float = 0.0, **_):
    """Replace the verifier's share of the total, w * r_obs, by w * r_hat (w = accuracy_weight)."""
    observed = signals.need("correct", "shaper noise_backward").double()
    corrected = backward_correction(observed, assumed_fp_rate, assumed_fn_rate)
    return rewards + (signals.accuracy_weight * (corrected - observed)).to(rewards.dtype), {}


# ---------------------------------------------------------------------------------------------------
# Learned reward models: PAR and pairwise win rates
# ---------------------------------------------------------------------------------------------------


def par_rewards(rewards: torch.Tensor, reference_rewards: torch.Tensor) -> torch.Tensor:
    """Preference As Reward ("Reward Shaping to Mitigate Reward Hacking in RLHF"):
        r_RL = (1 / M) sum_m sigmoid(r(x, y) - r(x, y_ref,m))
    with y_ref,m reference responses of the prompt (from the starting policy; M = 1 suffices, per the
    paper). Bounded in (0, 1), steepest near the reference reward, flat for outliers: a monotone but
    non-linear map, so unlike an affine one group normalisation does not undo it.
    rewards (N,); reference_rewards (N,) or (N, M). Returns (N,)."""
    reference = reference_rewards if reference_rewards.dim() == 2 else reference_rewards.unsqueeze(1)
    return torch.sigmoid(rewards.unsqueeze(1) - reference.to(rewards.dtype)).mean(dim=1)


@SHAPERS.register("par", needs=ShaperNeeds(reference_rewards=True))
def par_shaping(rewards, signals: GroupSignals, **_):
    reference = signals.need("reference_rewards", "shaper par")
    return par_rewards(rewards, reference), {}


def win_rate_rewards(scores: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """Pairwise win rate within the group (the tournament idea of Pref-GRPO / ArenaRL, here exhaustive):
        r_i = (1 / (n - 1)) sum_{j != i, same group} (1[s_i > s_j] + 0.5 * 1[s_i = s_j])
    Invariant to any monotone transform of the reward model's scores. A group of one gets 0.5.
    O(N^2) memory over the batch; fine for a step's few hundred samples. scores, groups: (N,)."""
    same = groups.unsqueeze(0) == groups.unsqueeze(1)  # (N, N)
    other = same & ~torch.eye(scores.numel(), dtype=torch.bool)
    wins = ((scores.unsqueeze(1) > scores.unsqueeze(0)).double()
            + 0.5 * (scores.unsqueeze(1) == scores.unsqueeze(0)).double())
    count = other.sum(dim=1)
    rate = (wins * other).sum(dim=1) / count.clamp(min=1)
    return torch.where(count > 0, rate, torch.full_like(rate, 0.5)).to(scores.dtype)


@SHAPERS.register("win_rate")
def win_rate_shaping(rewards, signals: GroupSignals, **_):
    return win_rate_rewards(rewards, signals.groups), {}

