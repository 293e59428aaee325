"""Golden losses: the loss each REAL training loop logs (train/loss, train/value_loss) on a fixed tiny
batch equals the value of the published formula, computed here independently in float64.

What is fixed: the completions (tests/loop_fixtures.FixedSampler, three texts of different token
lengths, so every micro-batch has padding), the rewards, and the learning rate (0, so every update of
a step sees the same weights and the logged loss is the loss of that one batch). What is injected
where a loop would otherwise make it trivial: the sampling policy's log-probs (the real ones plus a
fixed table of offsets, so importance ratios differ from 1 and some are clipped), the critic's old
values (idem), and the reference model (a perturbed copy of the policy, so KL terms and log-ratios
are not zero). The test side computes every log-prob with one unpadded forward pass per sequence
(loop_fixtures.plain_logprobs), never with rlx's batching, padding or masking.

Micro-batches are smaller than the batch and do not divide it, so a loop that normalised per
micro-batch instead of per batch, counted padded tokens, or averaged where the formula sums, fails.
The pure functions have their own hand-derived tests (tests/test_pg_math.py,
tests/test_preference_losses.py); these check the loop-level path around them.
"""

import math

import pytest
import torch

import rlx.build as build
from rlx.loops import policy_gradient, ppo, preference, reward_model, sft
from rlx.models import lora
from rlx.models import value as value_models
from rlx.runtime.rundir import read_metrics
from tests.loop_fixtures import (
    LIKELY,
    MID,
    PROMPTS,
    UNLIKELY,
    FixedSampler,
    completion_tokens,
    components,
    loop_config,
    offsets,
    one_thread,  # noqa: F401 (fixture)
    pair_config,
    perturbed_copy,
    plain_entropy,
    plain_logprobs,
    plain_score,
    render,
    rows,
    run_loop,
    scored_by,
    tiny_policy,
    tiny_scorer,
    write_pairs,
)

pytestmark = pytest.mark.usefixtures("one_thread")

REWARDS = {LIKELY: 1.0, UNLIKELY: 0.0, MID: 0.5}
# 2 prompts x 3 samples = 6 sequences in micro-batches of 4 + 2; two epochs so that old log-probs are used
RL = ["prompts_per_step=2", "rollout.samples_per_prompt=3", "micro_batch_size=4", "optim.lr=0", "steps=1",
      "algorithm.epochs=2", "algorithm.mini_batches=1"]


def _logged(tmp_path, key="train/loss") -> float:
    (row,) = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["step"] == 1]
    return row[key]


def _close(got: float, want: float):
    assert got == pytest.approx(want, rel=1e-4, abs=1e-5), (got, want)


def _softplus(x: float) -> float:
    return math.log1p(math.exp(-abs(x))) + max(x, 0.0)


def _logsigmoid(x: float) -> float:
    return -_softplus(-x)


# ------------------------------------------------------------------------------------------------
# Policy gradient: clipped surrogate, aggregations, GSPO, KL (loss k3 / reward k1), entropy
# ------------------------------------------------------------------------------------------------


def _group_advantages(rewards: list[float], group: int, scale: bool) -> list[float]:
    """GRPO (Shao et al. 2024): A_i = (r_i - mean_g) / (std_g + 1e-6), unbiased std; Dr. GRPO: no division."""
    out = []
    for lo in range(0, len(rewards), group):
        g = rewards[lo : lo + group]
        mean = sum(g) / len(g)
        std = math.sqrt(sum((x - mean) ** 2 for x in g) / (len(g) - 1))
        out += [(x - mean) / (std + 1e-6) if scale else x - mean for x in g]
    return out


PG_CASES = {
    # name: (overrides, aggregation, ratio level, dual clip)
    "grpo-token-mean": (["algorithm=grpo"], "token-mean", "token"),
    "grpo-seq-mean-token-mean": (["algorithm=grpo", "algorithm.loss_agg=seq-mean-token-mean"], "seq-mean-token-mean",
                                 "token"),
    "dr_grpo-constant-normaliser": (["algorithm=dr_grpo"], "seq-mean-token-sum-norm", "token"),
    "gspo-sequence-ratio": (["algorithm=gspo", "algorithm.mini_batches=1", "algorithm.clip_low=0.05",
                             "algorithm.clip_high=0.1"], "seq-mean-token-mean", "sequence"),
    "grpo-kl-k3-in-loss-and-entropy": (["algorithm=grpo", "algorithm.kl_coef=0.1", "algorithm.entropy_coef=0.01",
                                        "micro_batch_size=1"], "token-mean", "token"),
    "grpo-kl-k1-in-reward": (["algorithm=grpo", "algorithm.kl_coef=0.1", "algorithm.kl_in=reward",
                              "algorithm.kl_estimator=k1"], "token-mean", "token"),
    "grpo-packed-forward": (["algorithm=grpo", "algorithm.kl_coef=0.1", "packed_forward=true"], "token-mean", "token"),
}


@pytest.mark.parametrize("case", list(PG_CASES))
def test_policy_gradient_loss_matches_the_formula(tmp_path, monkeypatch, case):
    """loss_it = -min(rho_it A_i, clip(rho_it, 1 - eps_low, 1 + eps_high) A_i)            (PPO, Schulman et al. 2017)
                 + beta * (exp(ref - logp) - (ref - logp) - 1)   [kl_in=loss, k3: Schulman 2020; GRPO eq. 3]
                 - c_H * H_it                                    [entropy bonus]
    rho_it = pi / pi_old per token, or GSPO's (Zheng et al. 2025) exp(mean_t log(pi / pi_old)) per sequence;
    A_i from the group's rewards (GRPO; Dr. GRPO without the std); with kl_in=reward the reward is first
    r_i - beta * sum_t (log pi_old - log pi_ref) (k1, Ziegler et al. 2019).
    Aggregation over the batch: token-mean sum_it / sum_i |o_i| (DAPO); seq-mean-token-mean
    mean_i (sum_t / |o_i|) (GRPO); seq-mean-token-sum-norm sum_it / (N * max_new_tokens) (Dr. GRPO)."""
    overrides, agg, level = PG_CASES[case]
    model, tokenizer = tiny_policy()
    reference = perturbed_copy(model)
    sampler = FixedSampler(tokenizer, [LIKELY, UNLIKELY, MID])
    real_logprobs = policy_gradient.batched_logprobs

    def sampling_policy_logprobs(net, rollout, micro, with_entropy=False, temperature=1.0, pack=False, count_all=None):
        logp, entropy = real_logprobs(net, rollout, micro, with_entropy, temperature=temperature, pack=pack,
                                      count_all=count_all)
        if net is reference:
            return logp, entropy
        return logp + offsets(tuple(logp.shape)).to(logp.dtype), entropy  # the policy that sampled: pi + offset

    monkeypatch.setattr(build, "build_generator", sampler)
    monkeypatch.setattr(lora, "reference_model", lambda policy: reference)
    monkeypatch.setattr(policy_gradient, "batched_logprobs", sampling_policy_logprobs)
    cfg = loop_config(*RL, *overrides)
    run_loop(policy_gradient.train_policy_gradient, cfg, components(tmp_path, model, tokenizer, rows(PROMPTS[:2]),
                                                                           scored_by(REWARDS)))
    algo = cfg.algorithm

    samples = sampler.samples
    assert len(samples) == 6
    width = max(len(c) for _, c, _ in samples)
    table = offsets((len(samples), width))
    logp = [plain_logprobs(model, p, c) for p, c, _ in samples]
    ref = [plain_logprobs(reference, p, c) for p, c, _ in samples]
    old = [lp + table[i, : len(lp)] for i, lp in enumerate(logp)]
    rewards = [REWARDS[text] for _, _, text in samples]
    if algo.kl_coef > 0 and algo.kl_in == "reward":
        rewards = [r - algo.kl_coef * (o - f).sum().item() for r, o, f in zip(rewards, old, ref)]
    advantages = _group_advantages(rewards, 3, scale=algo.scale == "group")
    per_sequence = []  # (sum over tokens of loss_it, |o_i|)
    for i, (p, c, _) in enumerate(samples):
        log_ratio = logp[i] - old[i]
        ratio = torch.exp(log_ratio) if level == "token" else torch.exp(log_ratio.mean()).expand_as(log_ratio)
        a = advantages[i]
        token = -torch.minimum(ratio * a, ratio.clamp(1 - algo.clip_low, 1 + algo.clip_high) * a)
        if algo.kl_coef > 0 and algo.kl_in == "loss":
            d = logp[i] - ref[i]
            token = token + algo.kl_coef * (torch.exp(-d) - 1 + d)
        if algo.entropy_coef > 0:
            token = token - algo.entropy_coef * plain_entropy(model, p, c)
        per_sequence.append((token.sum().item(), len(c)))
    if agg == "token-mean":
        want = sum(s for s, _ in per_sequence) / sum(n for _, n in per_sequence)
    elif agg == "seq-mean-token-mean":
        want = sum(s / n for s, n in per_sequence) / len(per_sequence)
    else:
        want = sum(s for s, _ in per_sequence) / (len(per_sequence) * cfg.rollout.max_new_tokens)
    _close(_logged(tmp_path), want)


# ------------------------------------------------------------------------------------------------
# PPO: GAE, whitening, clipped surrogate on token advantages, clipped value loss
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("extra", [[], ["packed_forward=true"]], ids=["padded", "packed"])
def test_ppo_policy_and_value_losses_match_the_formulas(tmp_path, monkeypatch, extra):
    """GAE (Schulman et al. 2016), gamma = 1, lambda = 0.95, outcome reward on the last token:
        delta_t = r_t + V_old(t+1) - V_old(t)  (V_old after the last token = 0),  A_t = delta_t + lambda A_{t+1},
        R_t = A_t + V_old(t);  A whitened over every valid token of the batch: (A - mean) / (std + 1e-8).
    Policy: token-mean of -min(rho A, clip(rho, 0.8, 1.2) A).  Value (OpenAI baselines; Ziegler et al. 2019):
        token-mean of 0.5 * max((V - R)^2, (V_old + clip(V - V_old, -0.2, 0.2) - R)^2)."""
    model, tokenizer = tiny_policy()
    sampler = FixedSampler(tokenizer, [LIKELY, UNLIKELY, MID])
    real_logprobs, real_values, real_build = ppo.batched_logprobs, ppo.batched_values, value_models.build_value_model
    built = []

    def critic(*args, **kwargs):  # the real value model, its zero head replaced by small fixed weights
        value_model = real_build(*args, **kwargs)
        with torch.no_grad():
            value_model.head.weight.copy_(0.05 * torch.randn(value_model.head.weight.shape,
                                                             generator=torch.Generator().manual_seed(3)))
            value_model.head.bias.fill_(0.1)
        built.append(value_model)
        return value_model

    monkeypatch.setattr(build, "build_generator", sampler)
    monkeypatch.setattr(value_models, "build_value_model", critic)
    monkeypatch.setattr(ppo, "batched_logprobs",
                        lambda net, rollout, micro, with_entropy=False, temperature=1.0, pack=False, count_all=None: (
                            real_logprobs(net, rollout, micro, temperature=temperature, pack=pack,
                                          count_all=count_all)[0]
                            + offsets(tuple(rollout.completion_ids.shape)).float(), None))
    monkeypatch.setattr(ppo, "batched_values",
                        lambda net, rollout, micro, pack=False: real_values(net, rollout, micro, pack=pack)
                        + offsets(tuple(rollout.completion_ids.shape), scale=0.3).flip(0).float())
    cfg = loop_config(*RL, "algorithm=ppo", "algorithm.value_lr=0", *extra)
    run_loop(ppo.train_ppo, cfg, components(tmp_path, model, tokenizer, rows(PROMPTS[:2]), scored_by(REWARDS)))
    algo = cfg.algorithm

    samples, value_model = sampler.samples, built[0].eval()
    width = max(len(c) for _, c, _ in samples)
    table, value_table = offsets((len(samples), width)), offsets((len(samples), width), scale=0.3).flip(0)
    advantages, returns, values, old_values, ratios = [], [], [], [], []
    for i, (p, c, text) in enumerate(samples):
        with torch.no_grad():
            v = value_model(torch.tensor([p]), torch.ones(1, len(p), dtype=torch.long), torch.tensor([c]),
                            torch.ones(1, len(c), dtype=torch.long))[0].double()  # (C,)
        v_old = v + value_table[i, : len(c)]
        gae, a = 0.0, [0.0] * len(c)
        for t in reversed(range(len(c))):
            reward = REWARDS[text] if t == len(c) - 1 else 0.0
            next_value = v_old[t + 1].item() if t + 1 < len(c) else 0.0
            gae = reward + algo.gamma * next_value - v_old[t].item() + algo.gamma * algo.lam * gae
            a[t] = gae
        advantages.append(torch.tensor(a, dtype=torch.float64))
        returns.append(advantages[-1] + v_old)
        values.append(v)
        old_values.append(v_old)
        ratios.append(torch.exp(-table[i, : len(c)]))  # pi / pi_old = exp(logp - (logp + offset))
    flat = torch.cat(advantages)
    whitened = (flat - flat.mean()) / (flat.std() + 1e-8)
    rho = torch.cat(ratios)
    policy = -torch.minimum(rho * whitened, rho.clamp(1 - algo.clip_low, 1 + algo.clip_high) * whitened)
    v, v_old, r = torch.cat(values), torch.cat(old_values), torch.cat(returns)
    clipped = v_old + (v - v_old).clamp(-algo.value_clip, algo.value_clip)
    value = 0.5 * torch.maximum((v - r) ** 2, (clipped - r) ** 2)
    _close(_logged(tmp_path), policy.mean().item())
    _close(_logged(tmp_path, "train/value_loss"), value.mean().item())


# ------------------------------------------------------------------------------------------------
# Preference losses (summed completion log-probs, padding, micro-batches, SFT term), reward model, SFT
# ------------------------------------------------------------------------------------------------

PAIRS = [(PROMPTS[0], UNLIKELY, LIKELY), (PROMPTS[1], LIKELY, MID), (PROMPTS[2], MID, UNLIKELY)]


def _dpo_family(loss_type: str, h: float, beta: float, eps: float) -> float:
    """DPO -log s(beta h) (Rafailov et al. 2023); cDPO -(1-e) log s(beta h) - e log s(-beta h) (Mitchell 2023);
    robust [-(1-e) log s(beta h) + e log s(-beta h)] / (1 - 2e) (Chowdhury et al. 2024); IPO (h - 1/(2 beta))^2
    (Azar et al. 2023); SLiC hinge max(0, 1 - beta h) (Zhao et al. 2023)."""
    if loss_type == "dpo":
        return -_logsigmoid(beta * h)
    if loss_type == "cdpo":
        return -(1 - eps) * _logsigmoid(beta * h) - eps * _logsigmoid(-beta * h)
    if loss_type == "robust":
        return (-(1 - eps) * _logsigmoid(beta * h) + eps * _logsigmoid(-beta * h)) / (1 - 2 * eps)
    if loss_type == "ipo":
        return (h - 1 / (2 * beta)) ** 2
    return max(0.0, 1 - beta * h)


PREFERENCE_CASES = {  # name: (algorithm preset, overrides)
    "dpo": ("dpo", []),
    "dpo-precomputed-reference": ("dpo", ["algorithm.reference=precompute"]),
    "rpo-sft-term": ("dpo", ["algorithm.sft_weight=0.5"]),
    "cdpo": ("cdpo", []),
    "robust": ("robust_dpo", []),
    "ipo": ("ipo", []),
    "hinge": ("hinge", []),
    "ln_dpo": ("ln_dpo", []),
    "simpo": ("simpo", []),
    "orpo": ("orpo", []),
}


@pytest.mark.parametrize("case", list(PREFERENCE_CASES))
def test_preference_loss_matches_the_formula(tmp_path, monkeypatch, case):
    """Per pair, with pi_c = sum_t log pi(y_c,t | x, y_c,<t) over the completion tokens only (EOS included),
    h = (pi_c - ref_c) - (pi_r - ref_r) (each log-ratio divided by its length for ln_dpo, Tulu 3):
    the DPO family as in `_dpo_family`; SimPO -log s(beta (pi_c/|y_c| - pi_r/|y_r|) - gamma) (Meng et al.
    2024); ORPO lambda * -log s(log odds_c - log odds_r), odds = p / (1 - p), p = exp(pi / |y|) (Hong et al.
    2024). Loss = mean over the 3 pairs of (that + sft_weight * -pi_c / |y_c|) (RPO, Pang et al. 2024; ORPO)."""
    preset, overrides = PREFERENCE_CASES[case]
    cfg = pair_config(write_pairs(tmp_path / "pairs.jsonl", PAIRS), preset, "algorithm.batch_size=3",
                      "micro_batch_size=2", "optim.lr=0", "steps=1", "algorithm.reference=model", *overrides)
    algo = cfg.algorithm
    model, tokenizer = tiny_policy()
    reference = model if algo.reference == "precompute" else perturbed_copy(model)  # precompute: the starting policy
    monkeypatch.setattr(lora, "reference_model", lambda policy: reference)
    run_loop(preference.train_preference, cfg, components(tmp_path, model, tokenizer))

    losses = []
    for prompt, chosen, rejected in PAIRS:
        ids = render(tokenizer, prompt)
        c_ids, r_ids = completion_tokens(tokenizer, chosen), completion_tokens(tokenizer, rejected)
        pc, pr = plain_logprobs(model, ids, c_ids).sum().item(), plain_logprobs(model, ids, r_ids).sum().item()
        rc, rr = plain_logprobs(reference, ids, c_ids).sum().item(), plain_logprobs(reference, ids, r_ids).sum().item()
        lc, lr = len(c_ids), len(r_ids)
        if algo.loss_type == "simpo":
            loss = -_logsigmoid(algo.beta * (pc / lc - pr / lr) - algo.gamma)
        elif algo.loss_type == "orpo":
            def log_odds(avg):
                return avg - math.log1p(-math.exp(avg))

            loss = -algo.beta * _logsigmoid(log_odds(pc / lc) - log_odds(pr / lr))
        else:
            h = (pc - rc) / lc - (pr - rr) / lr if algo.length_normalize else (pc - rc) - (pr - rr)
            loss = _dpo_family(algo.loss_type, h, algo.beta, algo.label_smoothing)
        losses.append(loss + algo.sft_weight * -pc / lc)
    _close(_logged(tmp_path), sum(losses) / len(losses))


def test_reward_model_loss_matches_the_formula(tmp_path):
    """Bradley-Terry (Ouyang et al. 2022) with a per-pair margin (Llama 2, Touvron et al. 2023) and reward
    centering (Eisenstein et al. 2023): mean over pairs of -log s(s_c - s_r - m) + c (s_c + s_r)^2,
    s = the score head at the last token of prompt + completion (EOS)."""
    margins = [0.5, 0.0, 2.0]
    path = write_pairs(tmp_path / "pairs.jsonl", PAIRS, margins)
    cfg = pair_config(path, "reward_model", "algorithm.batch_size=3", "micro_batch_size=2", "optim.lr=0", "steps=1",
                      "algorithm.use_margin=true", "algorithm.center_coef=0.05", "data.pairs.columns.margin=margin")
    _, tokenizer = tiny_policy()
    model = tiny_scorer(tokenizer)
    run_loop(reward_model.train_reward_model, cfg, components(tmp_path, model, tokenizer))
    losses = []
    for (prompt, chosen, rejected), m in zip(PAIRS, margins):
        ids = render(tokenizer, prompt)
        sc = plain_score(model, ids + completion_tokens(tokenizer, chosen))
        sr = plain_score(model, ids + completion_tokens(tokenizer, rejected))
        losses.append(-_logsigmoid(sc - sr - m) + 0.05 * (sc + sr) ** 2)
    _close(_logged(tmp_path), sum(losses) / len(losses))


def test_sft_loss_is_the_token_mean_nll_of_the_batch(tmp_path):
    """SFT: -sum_i sum_t log pi(y_it | x_i, y_i,<t) / sum_i |y_i| over the whole batch (not a mean of
    micro-batch means), targets of different lengths (<answer>{answer}</answer> + EOS)."""
    model, tokenizer = tiny_policy()
    data = [{"prompt": p, "answer": a} for p, a in zip(PROMPTS, ["7", "1234567", "3 + 4 = 7"])]
    cfg = loop_config("algorithm=sft", "algorithm.batch_size=3", "micro_batch_size=2", "optim.lr=0", "steps=1")
    run_loop(sft.train_sft, cfg, components(tmp_path, model, tokenizer, data))
    logps = [plain_logprobs(model, render(tokenizer, row["prompt"]),
                            completion_tokens(tokenizer, f"<answer>{row['answer']}</answer>")) for row in data]
    assert len({len(lp) for lp in logps[:2]}) == 2  # targets of different lengths: padding in the first micro-batch
    _close(_logged(tmp_path), -torch.cat(logps).mean().item())
