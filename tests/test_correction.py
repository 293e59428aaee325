"""The off-policy correction (rlx/algorithms/offpolicy.py, rollout.correction*): hand-derived weights of every rule
and level, the loss each REAL loop logs with it (policy gradient and PPO), the proximal-log-prob rule, the old
knob's alias, the top-k caveat of rlx's decoder and the config rules around asynchronous rows."""

import math

import pytest
import torch

import rlx.build as build
from rlx.algorithms.losses import aggregate, clipped_surrogate
from rlx.algorithms.offpolicy import importance_correction, needs_proximal_logprobs, resolve_correction
from rlx.config.async_rules import check_async_settings
from rlx.config.overrides import check_overrides
from rlx.config.rules import check_settings
from rlx.config.settings import checked_settings
from rlx.engines.records import Generation
from rlx.errors import UserError
from rlx.loops import policy_gradient, ppo
from rlx.runtime.rundir import read_metrics
from tests.loop_fixtures import (
    LIKELY,
    MID,
    PROMPTS,
    UNLIKELY,
    FixedSampler,
    components,
    loop_config,
    one_thread,  # noqa: F401 (fixture)
    plain_logprobs,
    rows,
    run_loop,
    scored_by,
    tiny_policy,
)

# three rows of sampled tokens, log pi_prox - log mu per token (the third entry of row 0 is padding):
#   row 0: (0.5, -0.1)            ratios (1.6487, 0.9048)     sum 0.4      mean 0.2
#   row 1: (ln 3, -ln 4, 0.2)     ratios (3, 0.25, 1.2214)    sum -0.0877  mean -0.0292
#   row 2: (0.5, 0.5)             ratios (1.6487, 1.6487)     sum 1.0      mean 0.5
LOG_RATIO = torch.tensor([[0.5, -0.1, 3.0], [math.log(3), -math.log(4), 0.2], [0.5, 0.5, 9.0]])
MASK = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 0]])
E = math.exp
CASES = {
    # (rule, level, cap, low): (weights on the sampled tokens row by row, kept tokens)
    ("tis", "token", 2.0, 0.0): ([[E(.5), E(-.1)], [2.0, .25, E(.2)], [E(.5), E(.5)]], [[1, 1], [1, 1, 1], [1, 1]]),
    ("tis", "sequence", 2.0, 0.0): ([[E(.4)] * 2, [E(math.log(.75) + .2)] * 3, [2.0] * 2], [[1, 1], [1, 1, 1], [1, 1]]),
    ("tis", "geometric", 1.5, 0.0): ([[E(.2)] * 2, [E((math.log(.75) + .2) / 3)] * 3, [1.5] * 2],
                                     [[1, 1], [1, 1, 1], [1, 1]]),
    ("mis", "token", 2.0, 0.0): ([[E(.5), E(-.1)], [0.0, .25, E(.2)], [E(.5), E(.5)]], [[1, 1], [0, 1, 1], [1, 1]]),
    ("mis", "token", 2.0, 0.5): ([[E(.5), E(-.1)], [0.0, 0.0, E(.2)], [E(.5), E(.5)]], [[1, 1], [0, 0, 1], [1, 1]]),
    ("mis", "sequence", 2.0, 0.0): ([[E(.4)] * 2, [E(math.log(.75) + .2)] * 3, [0.0] * 2], [[1, 1], [1, 1, 1], [0, 0]]),
    ("none", "token", 2.0, 0.0): ([[1.0] * 2, [1.0] * 3, [1.0] * 2], [[1, 1], [1, 1, 1], [1, 1]]),
}


@pytest.mark.parametrize("case", list(CASES), ids=["-".join(map(str, c)) for c in CASES])
def test_weights_and_kept_tokens_by_hand(case):
    """tis: w = min(rho, C); mis: w = rho where low <= rho <= C, else the token (row) leaves the loss. token: rho_t =
    exp(d_t); sequence: exp(sum_t d_t) on every token of the row; geometric: exp(mean_t d_t). Worked in CASES."""
    rule, level, cap, low = case
    want_weights, want_kept = CASES[case]
    proximal = torch.randn(3, 3)
    out = importance_correction(proximal, proximal - LOG_RATIO, MASK, rule, level, cap, low)
    for row, (weights, kept) in enumerate(zip(want_weights, want_kept)):
        n = len(weights)
        torch.testing.assert_close(out.weights[row, :n], torch.tensor(weights), rtol=1e-5, atol=1e-6)
        assert out.kept[row, :n].long().tolist() == kept
        assert out.weights[row, n:].eq(1).all() and out.kept[row, n:].all()  # padding: left to the loss mask
        assert not out.bounded[row, n:].any()
    assert not out.weights.requires_grad


def test_huge_ratios_and_impossible_padding_stay_finite():
    """A row of 400 tokens each 0.5 nats more likely under pi_prox: the sequence ratio e^200 overflows float32; tis
    gives C, mis drops the row. Padding whose sampler log-prob is -inf (never sampled) must not turn into NaN."""
    d = torch.full((1, 400), 0.5)
    out = importance_correction(d, torch.zeros(1, 400), torch.ones(1, 400), "tis", "sequence", 2.0)
    assert out.weights.eq(2.0).all() and out.bounded.all()
    out = importance_correction(d, torch.zeros(1, 400), torch.ones(1, 400), "mis", "sequence", 2.0)
    assert out.weights.eq(0.0).all() and not out.kept.any()
    behaviour = torch.tensor([[-0.5, float("-inf")]])
    for rule in ("tis", "mis"):
        for level in ("token", "sequence", "geometric"):
            out = importance_correction(torch.tensor([[-0.4, -1.0]]), behaviour, torch.tensor([[1, 0]]), rule, level)
            assert torch.isfinite(out.weights).all(), (rule, level)


@pytest.mark.parametrize("case",
                         [("tis", "token", 2.0, 0.0), ("mis", "token", 2.0, 0.5), ("mis", "sequence", 2.0, 0.0)])
def test_the_corrected_loss_by_hand(case):
    """loss = token-mean over the KEPT tokens of -w_t * min(r_t A, clip(r_t) A), r = pi_theta / pi_prox = 1 at the
    update's first step. A = (+1, -1, +0.5) per row. tis: the sum of -w A over the 7 tokens is
    -(1.6487 + 0.9048) + (2 + 0.25 + 1.2214) - 0.5 * 2 * 1.6487 = -0.7309, / 7 = -0.10441; mis [0.5, 2] token: row 1
    keeps only its third token: (-2.5535 + 1.2214 - 1.6487) / 5 = -0.59618; mis sequence: row 2 (rho = e) leaves:
    (-2 * 1.4918 + 3 * 0.9161) / 5 = -0.04710."""
    rule, level, cap, low = case
    want = {("tis", "token", 2.0, 0.0): -0.104411, ("mis", "token", 2.0, 0.5): -0.596175,
            ("mis", "sequence", 2.0, 0.0): -0.047099}[case]
    proximal = torch.randn(3, 3)
    logp = proximal.clone().requires_grad_(True)
    corr = importance_correction(proximal, proximal - LOG_RATIO, MASK, rule, level, cap, low)
    mask = MASK * corr.kept.long()
    advantages = torch.tensor([1.0, -1.0, 0.5])
    token_loss, _ = clipped_surrogate(logp, proximal, advantages, mask, 0.2, 0.2)
    loss = aggregate(token_loss * corr.weights, mask, "token-mean", mask.sum().item(), 3)
    assert loss.item() == pytest.approx(want, abs=1e-5)
    loss.backward()  # d loss / d logp_t = -w_t A / kept tokens: the weight scales the gradient, carries none itself
    torch.testing.assert_close(logp.grad, -corr.weights * advantages[:, None] * mask / mask.sum())


def test_the_proximal_rule():
    """A separate pass before the update: several optimizer steps, KL in the reward, or a rejecting rule (mis); one
    step with tis or none takes pi_prox from the update's own detached forward (the weights have not moved yet)."""
    assert not needs_proximal_logprobs(1, False, "none") and not needs_proximal_logprobs(1, False, "tis")
    assert needs_proximal_logprobs(2, False, "tis") and needs_proximal_logprobs(1, True, "none")
    assert needs_proximal_logprobs(1, False, "mis")


def test_tis_cap_is_read_as_tis_at_token_level():
    assert resolve_correction("none", "sequence", 2.0, 0.0, 3.0) == ("tis", "token", 3.0, 0.0)
    assert resolve_correction("mis", "sequence", 4.0, 0.5, None) == ("mis", "sequence", 4.0, 0.5)
    assert resolve_correction("none", "token", 2.0, 0.0, None) == ("none", "token", 2.0, 0.0)


# ------------------------------------------------------------------------------------------------
# The real loops: the loss they log with a correction
# ------------------------------------------------------------------------------------------------

REWARDS = {LIKELY: 1.0, UNLIKELY: 0.0, MID: 0.5}
# behaviour log-prob = the policy's minus BEHAVIOUR[j] for sample j of a prompt: ratios e^0.9 = 2.46 (above the
# cap 2: truncated or dropped), e^0.3 = 1.35 and e^-0.6 = 0.55
BEHAVIOUR = [0.9, 0.3, -0.6]


class BehaviourSampler(FixedSampler):
    """Fixed completions whose sampler log-probs are the policy's own minus BEHAVIOUR[j] (sample j of a prompt), so
    pi_prox / mu = exp(BEHAVIOUR[j]) on every token of that row."""

    def generate_ids(self, prompts, *, samples_per_prompt=1, **_):
        out = super().generate_ids(prompts, samples_per_prompt=samples_per_prompt)
        logprobs = [(plain_logprobs(self.model, list(prompts[i // samples_per_prompt]), ids)
                     - BEHAVIOUR[i % samples_per_prompt]).tolist() for i, ids in enumerate(out.ids)]
        return Generation(out.ids, logprobs, out.stopped)


def _group_advantages(rewards, group):
    out = []
    for lo in range(0, len(rewards), group):
        g = rewards[lo : lo + group]
        mean = sum(g) / len(g)
        std = math.sqrt(sum((x - mean) ** 2 for x in g) / (len(g) - 1))
        out += [(x - mean) / (std + 1e-6) for x in g]
    return out


def _weights(rule, low):
    """Per sample j of a group: (weight, kept) of ratio e^BEHAVIOUR[j] under cap 2."""
    out = []
    for b in BEHAVIOUR:
        rho = math.exp(b)
        if rule == "tis":
            out.append((min(rho, 2.0), True))
        else:
            inside = low <= rho <= 2.0
            out.append((rho if inside else 0.0, inside))
    return out


LOOP_CASES = {"tis": ["rollout.correction=tis"], "mis": ["rollout.correction=mis"],
              "mis-two-sided": ["rollout.correction=mis", "rollout.correction_low=0.6"],
              "tis-cap-alias-epochs": ["+rollout.tis_cap=2", "algorithm.epochs=2"]}


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("case", list(LOOP_CASES))
def test_policy_gradient_logs_the_corrected_loss(tmp_path, monkeypatch, case):
    """One GRPO step, lr 0 (r = 1): train/loss = sum over kept tokens of -w_j A_i / kept tokens (token-mean), with
    w_j = min(e^b_j, 2) (tis) or e^b_j kept when low <= e^b_j <= 2 (mis); rollout/is_bounded_frac = the share of the
    sampled tokens truncated or dropped."""
    model, tokenizer = tiny_policy()
    sampler = BehaviourSampler(tokenizer, [LIKELY, UNLIKELY, MID])
    monkeypatch.setattr(build, "build_generator", sampler)
    overrides = LOOP_CASES[case]
    if "tis_cap" in overrides[0]:  # the older knob lives in rollout=vllm|server; the generator is replaced anyway
        overrides = ["rollout=vllm", *overrides]
    cfg = loop_config("prompts_per_step=2", "rollout.samples_per_prompt=3", "micro_batch_size=4", "optim.lr=0",
                      "steps=1", *overrides)
    run_loop(policy_gradient.train_policy_gradient, cfg,
             components(tmp_path, model, tokenizer, rows(PROMPTS[:2]), scored_by(REWARDS)))
    (row,) = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["step"] == 1]
    low = 0.6 if case == "mis-two-sided" else 0.0
    weights = _weights("mis" if case.startswith("mis") else "tis", low)
    advantages = _group_advantages([REWARDS[t] for _, _, t in sampler.samples], 3)
    total, kept_tokens, bounded, sampled = 0.0, 0, 0, 0
    for i, (_, ids, _) in enumerate(sampler.samples):
        w, kept = weights[i % 3]
        sampled += len(ids)
        bounded += len(ids) * (w != math.exp(BEHAVIOUR[i % 3]))
        if kept:
            total += -w * advantages[i] * len(ids)
            kept_tokens += len(ids)
    assert row["train/loss"] == pytest.approx(total / kept_tokens, rel=1e-4, abs=1e-6)
    assert row["rollout/is_bounded_frac"] == pytest.approx(bounded / sampled)
    if case.startswith("tis"):
        assert row["rollout/tis_capped_frac"] == row["rollout/is_bounded_frac"]


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("rule", ["tis", "mis"])
def test_ppo_weights_its_policy_term(tmp_path, monkeypatch, rule):
    """PPO, one step at lr 0, value loss on: the policy part is the token-mean over kept tokens of -w_j A_t with the
    whitened GAE advantages A_t; compared with the same run uncorrected, whose advantages are the same: the logged
    policy loss of the corrected run equals sum(-w A) / kept from the uncorrected run's per-token terms."""
    model, tokenizer = tiny_policy()
    seen = {}
    real_whiten = ppo.whiten

    def recording_whiten(values, mask):
        out = real_whiten(values, mask)
        seen["advantages"], seen["mask"] = out.clone(), mask.clone()
        return out

    monkeypatch.setattr(ppo, "whiten", recording_whiten)
    sampler = BehaviourSampler(tokenizer, [LIKELY, UNLIKELY, MID])
    monkeypatch.setattr(build, "build_generator", sampler)
    cfg = loop_config("algorithm=ppo", "prompts_per_step=2", "rollout.samples_per_prompt=3", "micro_batch_size=4",
                      "optim.lr=0", "algorithm.value_lr=0", "algorithm.mini_batches=1", "steps=1",
                      f"rollout.correction={rule}")
    run_loop(ppo.train_ppo, cfg, components(tmp_path, model, tokenizer, rows(PROMPTS[:2]), scored_by(REWARDS)))
    (row,) = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["step"] == 1]
    advantages, mask = seen["advantages"], seen["mask"]  # (N, C) whitened over the batch, (N, C)
    weights = _weights(rule, 0.0)
    total, kept_tokens = 0.0, 0
    for i in range(advantages.shape[0]):
        w, kept = weights[i % 3]
        if kept:
            total += -(w * advantages[i] * mask[i]).sum().item()
            kept_tokens += int(mask[i].sum())
    assert row["train/loss"] == pytest.approx(total / kept_tokens, rel=1e-4, abs=1e-6)


# ------------------------------------------------------------------------------------------------
# What rlx's decoder records under top-k, and the config rules
# ------------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("one_thread")
def test_the_decoder_records_the_unfiltered_log_prob_under_top_k():
    """rollout=hf with top_k=3: the recorded log-prob of each sampled token is log softmax(z / T) over the whole
    vocabulary (the trainer's), not the renormalised top-3 one (larger by -log of the top-3 mass): so the correction's
    weight at staleness 0 is 1, whatever the filter."""
    from rlx.engines.generator import HFGenerator

    model, tokenizer = tiny_policy()
    generator = HFGenerator(model, tokenizer, temperature=0.8, top_k=3, logprobs="sampler")
    prompt = tokenizer(PROMPTS[0], add_special_tokens=False)["input_ids"]
    out = generator.generate_ids([prompt], max_new_tokens=8, seeds=[1, 2], samples_per_prompt=2)
    for ids, recorded in zip(out.ids, out.logprobs):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].double() / 0.8
        full = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None]).squeeze(1)
        # log of the kept mass
        top3 = torch.logsumexp(torch.topk(logits, 3, -1).values, -1) - torch.logsumexp(logits, -1)
        torch.testing.assert_close(torch.tensor(recorded, dtype=torch.float64), full, atol=1e-4, rtol=0)
        assert (top3 < -1e-3).any()  # the filtered log-prob (full - top3) would have differed


ASYNC_BAD = [
    (["rollout.max_staleness=1"],
     "error: rollout.max_staleness=1 trains on rows sampled by older weights: set an off-policy "
                                  "correction, e.g. rollout.correction=tis"),
    (["rollout.partial=true"], "rollout.correction=tis"),
    (["rollout=vllm", "rollout.max_staleness=1", "rollout.correction=tis"], "use rollout=server"),
    (["rollout=server", "rollout.partial=true", "rollout.correction=tis"], "use rollout=hf"),
    (["rollout=server", "rollout.correction=tis", "rollout.top_p=0.9"], "rollout.top_p=1 rollout.top_k=0"),
    (["rollout=vllm", "rollout.tis_cap=2", "rollout.correction=mis"], "set only one of rollout.tis_cap"),
    (["rollout.correction=tis", "rollout.correction_low=0.5"], "rollout.correction_low=0"),
    (["algorithm=dpo", "data=prefs", "rollout.max_staleness=1", "rollout.correction=tis"], "leave it at its default"),
    (["rollout.partial=true", "rollout.correction=tis", "algorithm=dapo"], "algorithm.dynamic_sampling=false"),
]


@pytest.mark.parametrize("overrides,needle", ASYNC_BAD)
def test_async_settings_are_refused_in_one_line(overrides, needle):
    cfg = check_overrides(overrides)
    check_settings(checked_settings(cfg))
    with pytest.raises(UserError) as info:
        check_async_settings(checked_settings(cfg), 1)
    message = f"error: {info.value}"
    assert needle in message and "\n" not in message


def test_pipeline_mode_and_partial_rollouts_run_on_several_processes():
    """Pipeline mode and partial rollouts on several (DDP) processes: rank 0 samples (and holds the pool of carried
    groups) and broadcasts each step's batch (tests/test_server_ddp.py, tests/test_stages_ddp.py)."""
    cfg = check_overrides(["rollout.max_staleness=1", "rollout.correction=tis"])
    check_async_settings(checked_settings(cfg), 1)
    check_async_settings(checked_settings(cfg), 2)
    partial = check_overrides(["rollout.partial=true", "rollout.correction=tis"])
    check_async_settings(checked_settings(partial), 1)
    check_async_settings(checked_settings(partial), 2)
