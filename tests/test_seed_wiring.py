"""The seed ideas wired into training (issue 29 part 2): the shared hooks by hand, and every option's mechanism at
work in a real 2-step run (its metric appears and moves), and exact resumes for the options that keep state.

Hooks: groups keyed by id (keyed estimators), per-token temperatures (decoder and trainer), hints (rows, contexts,
the ratio's denominator in the hinted context), G-RA's outcome split, the progress corridor. Runs: the real loop on
the tiny model and chain_sum, in-process (rlx.cli.training.run), one thread."""

from __future__ import annotations

import math

import pytest
import torch

from rlx.algorithms.advantages import group_advantages, rloo_advantages
from rlx.algorithms.grouping import fixed_groups
from rlx.algorithms.keyed_advantages import keyed_group_advantages, keyed_rloo_advantages
from rlx.config.overrides import check_overrides
from rlx.config.rules import check_settings
from rlx.config.settings import checked_settings
from rlx.engines.records import Episode
from rlx.envs.gated import ProgressCorridor
from rlx.loops.credit import episode_outcomes
from rlx.models.forward import completion_logprobs
from rlx.rollout.single_turn import tied_group_fraction
from rlx.rollout.types import HintedContext, SameContext
from rlx.runtime.rundir import read_metrics
from tests.loop_fixtures import QUIET, one_thread, tiny_policy  # noqa: F401 (fixture)

pytestmark = pytest.mark.usefixtures("one_thread")
T = torch.tensor


# --------------------------------------------------------------------------------------------------
# groups keyed by id
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_keyed_grpo_matches_the_fixed_groups_on_equal_groups(scale):
    rewards = T([1.0, 0.0, 0.0, 1.1, 0.1, 0.1, 0.1, 0.1, 0.5, 0.2, 0.9, 0.0])
    fixed = group_advantages(rewards, 4, scale)
    keyed = keyed_group_advantages(rewards, fixed_groups(12, 4), scale)
    assert torch.allclose(keyed, fixed, atol=1e-6)
    assert torch.allclose(keyed_rloo_advantages(rewards, fixed_groups(12, 4)), rloo_advantages(rewards, 4), atol=1e-6)


def test_keyed_grpo_on_groups_of_different_sizes_by_hand():
    """Group 0 = [1, 0, 0, 0, 1] (4 plain samples + 1 hinted re-sample): mean 0.4, unbiased std
    sqrt((2 x 0.36 + 3 x 0.16) / 4) = sqrt(0.3) = 0.547723 -> A = 0.6 / 0.547723 = 1.095445 and -0.730297.
    Group 1 = [0, 0] ties -> 0. RLOO on group 0: n / (n - 1) (r - mean) = 1.25 x 0.6 = 0.75 and -0.5."""
    rewards = T([1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0])
    groups = T([0, 0, 0, 0, 0, 1, 1])
    advantages = keyed_group_advantages(rewards, groups, "group", 0.0)
    assert advantages.tolist() == pytest.approx([1.095445, -0.730297, -0.730297, -0.730297, 1.095445, 0, 0], abs=1e-5)
    rloo = keyed_rloo_advantages(rewards, groups)
    assert rloo.tolist() == pytest.approx([0.75, -0.5, -0.5, -0.5, 0.75, 0, 0])


def test_tied_group_fraction_counts_groups_not_samples():
    """Groups {0: [1, 1, 1] tied, 1: [0, 1] mixed}: one group in two ties (samples would say 3 of 5)."""
    assert tied_group_fraction(T([1.0, 1.0, 1.0, 0.0, 1.0]), T([0, 0, 0, 1, 1])) == 0.5


# --------------------------------------------------------------------------------------------------
# per-token temperatures (EAD): the trainer's forward and the decoder's record
# --------------------------------------------------------------------------------------------------


@torch.no_grad()
def test_per_token_temperatures_in_the_forward_by_position():
    """completion_logprobs with an (N, C) temperature: position t's log-prob is log softmax(z_t / tau_t), checked
    against one unpadded forward pass scaled position by position; a constant tensor equals the float path."""
    model, tokenizer = tiny_policy()
    prompt = tokenizer("What is 3 + 4?", add_special_tokens=False)["input_ids"]
    completion = tokenizer("<answer>7</answer>", add_special_tokens=False)["input_ids"]
    taus = torch.linspace(1.2, 0.3, len(completion))
    logp, _ = completion_logprobs(model, T([prompt]), torch.ones(1, len(prompt), dtype=torch.long), T([completion]),
                                  torch.ones(1, len(completion), dtype=torch.long), temperature=taus.unsqueeze(0))
    logits = model(input_ids=T([prompt + completion])).logits[0, len(prompt) - 1 : -1].double()  # (C, V)
    expected = torch.log_softmax(logits / taus.double().unsqueeze(1), -1).gather(1, T(completion)[:, None]).squeeze(1)
    assert torch.allclose(logp[0].double(), expected, atol=1e-4)
    flat, _ = completion_logprobs(model, T([prompt]), torch.ones(1, len(prompt), dtype=torch.long), T([completion]),
                                  torch.ones(1, len(completion), dtype=torch.long), temperature=0.7)
    same, _ = completion_logprobs(model, T([prompt]), torch.ones(1, len(prompt), dtype=torch.long), T([completion]),
                                  torch.ones(1, len(completion), dtype=torch.long),
                                  temperature=torch.full((1, len(completion)), 0.7))
    assert torch.allclose(flat, same, atol=1e-6)


def test_the_decoder_samples_and_records_at_each_positions_temperature():
    """A schedule [tau_0, tau_1, ...]: the recorded log-prob of token t is log softmax(z_t / tau_t) (rescored
    here position by position), and a constant schedule [0.7] x n draws exactly what temperature 0.7 draws."""
    from rlx.engines.generator import HFGenerator

    model, tokenizer = tiny_policy()
    generator = HFGenerator(model, tokenizer, temperature=1.0, logprobs="sampler")
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 3 + 4?"}], tokenize=False,
                                           add_generation_prompt=True)
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    schedule = [1.2 - 0.1 * t for t in range(12)]
    out = generator.generate_ids([ids], max_new_tokens=12, seeds=[11, 12, 13], samples_per_prompt=3, schedule=schedule)
    for sampled, recorded in zip(out.ids, out.logprobs):
        with torch.no_grad():
            logits = model(input_ids=T([ids + sampled])).logits[0, len(ids) - 1 : -1].double()
        taus = torch.tensor(schedule[: len(sampled)], dtype=torch.float64).unsqueeze(1)
        rescored = torch.log_softmax(logits / taus, -1).gather(1, T(sampled)[:, None]).squeeze(1)
        assert torch.allclose(T(recorded, dtype=torch.float64), rescored, atol=1e-4)
    constant = generator.generate_ids([ids], max_new_tokens=12, seeds=[11, 12, 13], samples_per_prompt=3,
                                      schedule=[0.7] * 12)
    plain = HFGenerator(model, tokenizer, temperature=0.7, logprobs="sampler").generate_ids(
        [ids], max_new_tokens=12, seeds=[11, 12, 13], samples_per_prompt=3)
    assert constant.ids == plain.ids and constant.logprobs == plain.logprobs


# --------------------------------------------------------------------------------------------------
# G-RA's outcome, the progress corridor
# --------------------------------------------------------------------------------------------------


def test_gra_takes_the_outcome_out_of_the_last_step():
    """Episode 0: steps [0.3, 0.3, 1.3] with outcome 1 -> immediate [0.3, 0.3, 0.3]; episode 1: [0.3, 0.3] with
    no outcome in its metrics and success 0 -> outcome 0, immediate unchanged."""
    episodes = [Episode([1], step_rewards=[0.3, 0.3, 1.3], metrics={"outcome": 1.0, "success": 1.0}),
                Episode([1], step_rewards=[0.3, 0.3], metrics={"success": 0.0})]
    outcome, immediate = episode_outcomes(episodes, T([0, 0, 0, 1, 1]), T([0.3, 0.3, 1.3, 0.3, 0.3]))
    assert outcome.tolist() == [1.0, 0.0]
    assert immediate.tolist() == pytest.approx([0.3, 0.3, 0.3, 0.3, 0.3])


def test_progress_corridor_pays_for_walking_right_even_into_the_locked_door():
    """Length 5, seed 0: R from the start pays 0.3 each, the locked door never opens (outcome 0); fetching the
    key first, then walking through the door pays 1 + 0.3 per R (outcome 1)."""
    env = ProgressCorridor(right_reward=0.3)
    env.reset(seed=0)
    farmed = [env.step("R") for _ in range(8)]
    assert [r for _, r, *_ in farmed] == pytest.approx([0.3] * 8)
    assert farmed[-1][3] and all(info["metrics"]["outcome"] == 0.0 for *_, info in farmed)
    env.reset(seed=0)
    rewards, done = [], False
    while not done:
        _, reward, done, truncated, info = env.step(env.expert_action())
        rewards.append(reward)
        done = done or truncated
    assert info["metrics"] == {"success": 1.0, "outcome": 1.0} and rewards[-1] == pytest.approx(1.3)


# --------------------------------------------------------------------------------------------------
# hints: the rows, their contexts and the ratio's denominator
# --------------------------------------------------------------------------------------------------


def _producer(*overrides, reward=lambda prompts, completions, **row: [0.0] * len(completions)):
    """A single-turn producer on the tiny model, 3 chain_sum-like rows, a reward that fails everything."""
    from accelerate import Accelerator

    from rlx.build import single_turn_producer
    from rlx.config.settings import settings as settings_of
    from rlx.engines.generator import policy_generator
    from rlx.loops.common import ProducerParts
    from rlx.rewards import RewardComponent

    cfg = check_overrides([*QUIET, "prompts_per_step=3", "rollout.samples_per_prompt=2", *overrides])
    check_settings(checked_settings(cfg))
    s = settings_of(cfg)
    model, tokenizer = tiny_policy()
    rows = [{"prompt": f"What is {a} + {b}?\nGive the final answer as <answer>...</answer>.", "answer": str(a + b)}
            for a, b in ((3, 4), (2, 5), (6, 1))]
    parts = ProducerParts(policy_generator(model, tokenizer, s.rollout), tokenizer, rows, [],
                          [RewardComponent("task", reward, 1.0)], None, Accelerator(cpu=True))
    return single_turn_producer(s, parts), model, tokenizer


def test_prefix_hints_continue_from_the_reference_and_train_only_what_was_sampled():
    """Every group fails, so each gets 3 hinted re-samples (hints.samples) right after its 2 plain ones: group
    sizes 5, the training prompt is the plain one, the completion starts with the first ceil(0.5 n) tokens of
    "<answer>N</answer>" (attended, loss mask 0) and continues with the sampled tokens (loss mask 1)."""
    producer, _, tokenizer = _producer("algorithm.hints.enabled=true", "algorithm.hints.placement=prefix",
                                       "algorithm.hints.samples=3", "algorithm.hints.fraction_start=0.5",
                                       "algorithm.hints.anneal_steps=0", "algorithm.hints.fraction_end=0.5")
    batch = producer.produce(1)
    assert batch.groups.tolist() == [0] * 5 + [1] * 5 + [2] * 5 and isinstance(batch.context, SameContext)
    rollout = batch.rollout
    for group, answer in enumerate(["7", "7", "7"]):
        reference = tokenizer(f"<answer>{answer}</answer>", add_special_tokens=False)["input_ids"]
        keep = math.ceil(0.5 * len(reference))
        for row in range(group * 5 + 2, group * 5 + 5):
            assert rollout.completion_ids[row, :keep].tolist() == reference[:keep]
            assert rollout.loss_mask[row, :keep].tolist() == [0] * keep
            assert rollout.loss_mask[row].sum() == rollout.completion_mask[row].sum() - keep
            assert torch.equal(rollout.prompt_ids[row], rollout.prompt_ids[group * 5])  # the plain prompt
    assert batch.metrics["hints/hinted_groups"] == 3 and batch.metrics["hints/all_fail_groups"] == 3


def test_the_hints_stage_counts_the_all_fail_groups_its_hints_rescue():
    """Three all-fail groups, each hinted with its whole reference "<answer>7</answer>" as a prefix (fraction 1); the
    reward pays only "3 + 4"'s completions that hold it, so the hinted re-samples of that group are correct and the
    other two groups stay failed: hints/rescued_frac = 1 / 3."""

    def reward(prompts, completions, **row):
        return [float("3 + 4" in p and "<answer>7</answer>" in c) for p, c in zip(prompts, completions)]

    producer, _, _ = _producer("algorithm.hints.enabled=true", "algorithm.hints.placement=prefix",
                               "algorithm.hints.fraction_start=1.0", "algorithm.hints.anneal_steps=0",
                               "algorithm.hints.fraction_end=1.0", reward=reward)
    metrics = producer.produce(1).metrics
    assert metrics["hints/all_fail_groups"] == 3 and metrics["hints/hinted_groups"] == 3
    assert metrics["hints/rescued_frac"] == pytest.approx(1 / 3)


@torch.no_grad()
def test_guide_hints_take_the_ratios_denominator_in_the_hinted_context():
    """placement=prompt: the training rows carry the plain prompt, Batch.context (a HintedContext) the hinted one;
    the old log-probs computed on Batch.sampled_in (what the loop does) reproduce what the sampler recorded, while the
    same completions scored after the plain prompt differ: the ratio pi(y | x) / pi_old(y | x + h)."""
    from rlx.loops.common import batched_logprobs

    producer, model, tokenizer = _producer("algorithm.hints.enabled=true", "algorithm.hints.samples=2",
                                           "algorithm.hints.fraction_start=1.0", "algorithm.hints.anneal_steps=0",
                                           "algorithm.hints.fraction_end=1.0")
    batch = producer.produce(1)
    hinted = torch.tensor([i % 4 >= 2 for i in range(12)])
    assert isinstance(batch.context, HintedContext) and batch.sampled_in is batch.context.rollout
    sampled_in = batch.sampled_in
    assert len(sampled_in) == len(batch.rollout) == 12
    text = tokenizer.decode(sampled_in.prompt_ids[2][sampled_in.prompt_mask[2].bool()])
    assert "Hint: the solution begins with: <answer>7</answer>" in text
    behaviour_prompt = sampled_in.prompt_ids[0][sampled_in.prompt_mask[0].bool()]
    assert torch.equal(behaviour_prompt, batch.rollout.prompt_ids[0][batch.rollout.prompt_mask[0].bool()])  # plain rows
    mask = batch.rollout.loss_mask.bool()
    behaviour, _ = batched_logprobs(model, sampled_in, 64)
    plain, _ = batched_logprobs(model, batch.rollout, 64)
    assert torch.allclose(behaviour[mask], batch.rollout.logprobs[mask], atol=1e-4)
    gap = (plain - batch.rollout.logprobs).abs()[mask & hinted.unsqueeze(1)]
    assert gap.max() > 0.1  # the hint changes the completions' likelihood: the two contexts are not the same


# --------------------------------------------------------------------------------------------------
# every option in a real run: its mechanism metric appears and moves
# --------------------------------------------------------------------------------------------------

RUN = [*QUIET, "hardware.num_threads=1", "prompts_per_step=4", "rollout.samples_per_prompt=4", "data.train_size=64",
       "data.eval_size=8", "data.task_config.max_terms=4", "save.final=false"]
AGENT = [*QUIET, "hardware.num_threads=1", "model.path=builtin:tiny_agent", "data.source=none", "prompts_per_step=4",
         "rollout.samples_per_prompt=4", "save.final=false", "env.eval_episodes=4", "optim.lr=5e-4"]


def train(tmp_path, *overrides, base=RUN, steps=2, run_dir=None) -> list[dict]:
    """`rlx train` in-process (the real loop, builder and producer); the rows of metrics.jsonl."""
    from rlx.cli.training import run

    cfg = check_overrides([*base, f"steps={steps}", *overrides])
    run_dir = run_dir or tmp_path / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    run(cfg, run_dir, list(overrides))
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if r["step"] > 0]


# option -> (overrides, its mechanism metric); each metric must be logged at every step and be non-zero at one
# (the option acted), and a run without the option logs none of them (the metric is the option's)
MECHANISMS = {
    "ngrpo": (["algorithm=ngrpo", "algorithm.dynamic_sampling=false"], "train/ngrpo_dead_groups_revived"),
    "drop_all_incorrect": (["algorithm=dapo", "algorithm.dynamic_sampling_drop=all_incorrect"],
                           "sampling/dropped_groups"),
    "laser": (["algorithm=laser", "algorithm.shaping.target_tokens=8"], "shaping/laser_delta_abs"),
    "laser_d": (["algorithm=laser_d", "algorithm.shaping.adapt_every=1"], "shaping/laser_target_hard"),
    # chain_sum's right answers all have one length, so the length options judge "correct" by the format verdict
    # (well-formed answers differ in length and often fill a group)
    "concise": (["algorithm.shapers=[concise]", "reward.accuracy=format"], "shaping/concise_delta_abs"),
    "unlikeliness": (["algorithm=unlikeliness"], "shaping/unlikeliness_delta_abs"),
    "noise_backward": (["algorithm.shapers=[noise_backward]", "algorithm.shaping.assumed_fp_rate=0.1"],
                       "shaping/noise_backward_delta_abs"),
    "par": (["algorithm.shapers=[par]"], "shaping/par_delta_abs"),
    "win_rate": (["algorithm.shapers=[win_rate]"], "shaping/win_rate_delta_abs"),
    "agrae": (["algorithm=agrae"], "transform/agrae_delta_abs"),
    "pass_at_k": (["algorithm.transforms=[pass_at_k]", "algorithm.shaping.pass_k=2"], "transform/pass_at_k_delta_abs"),
    "efficiency": (["algorithm.transforms=[efficiency]", "reward.accuracy=format"], "shaping/efficiency_term_abs"),
    "noise_forward": (["algorithm.transforms=[noise_forward]", "algorithm.shaping.assumed_fn_rate=0.2"],
                      "transform/noise_forward_delta_abs"),
    "verifier_noise": (["algorithm.verifier_noise.fn_rate=0.3", "algorithm.verifier_noise.fp_rate=0.2"],
                       "noise/flipped_frac"),
    "prompt_sampling": (["algorithm.prompt_sampling.mode=learnability", "data.train_size=8"],
                        "sampling/drawn_pass_estimate"),
    "replay": (["algorithm.replay.enabled=true", "data.train_size=4", "algorithm.replay.trigger=tied"],
               "replay/groups_filled"),
    "hints_prefix": (["algorithm.hints.enabled=true", "algorithm.hints.placement=prefix"], "hints/hinted_groups"),
    "hints_guide": (["algorithm.hints.enabled=true"], "hints/hinted_groups"),
    "ead": (["rollout.temperature_schedule.mode=ead"], "rollout/temperature_mean"),
}
AGENT_MECHANISMS = {
    "gra": (["algorithm=agent_grpo", "env=custom", "env.target=rlx.envs.gated.ProgressCorridor", "env.max_new_tokens=3",
             "algorithm.credit=gra", "algorithm.gate_threshold=1.0"], "env/gated_frac"),
    "hgpo": (["algorithm=hgpo", "env=grid"], "env/hgpo_depth_used"),
    "entropy_smoothing": (["algorithm=gigpo", "env=corridor", "algorithm.entropy_smoothing.coef=0.1"],
                          "train/entropy_band_penalty"),
}


@pytest.mark.parametrize("option", [*MECHANISMS, *AGENT_MECHANISMS])
def test_a_two_step_run_uses_the_option(tmp_path, option):
    overrides, metric = MECHANISMS.get(option) or AGENT_MECHANISMS[option]
    steps = 3 if option in ("replay", "entropy_smoothing") else 2  # a buffer / a history to fill first
    rows = train(tmp_path, *overrides, base=AGENT if option in AGENT_MECHANISMS else RUN, steps=steps)
    values = [row.get(metric) for row in rows]
    assert all(isinstance(v, (int, float)) for v in values), (metric, values)
    assert any(v != 0 for v in values), (metric, values)
    if option == "hints_guide":  # the loop's old log-probs are taken where the rows were sampled (the hinted prompt):
        # they agree with the sampler's to float noise; scored after the plain prompt they would not
        assert max(row["rollout/logprob_gap_max"] for row in rows) < 1e-3


def test_a_run_without_the_options_logs_none_of_their_metrics(tmp_path):
    rows = train(tmp_path, "algorithm=dapo")  # dynamic sampling with its default drop strategy
    logged = {key for row in rows for key in row}
    metrics = {m for _, m in MECHANISMS.values()} - {"sampling/dropped_groups"}  # dynamic sampling's own count
    assert not metrics & logged, metrics & logged


# --------------------------------------------------------------------------------------------------
# resume: 4 steps against 2 + 2 resumed, every logged value equal
# --------------------------------------------------------------------------------------------------

STATEFUL = {
    "prompt_sampling": ["algorithm.prompt_sampling.mode=learnability", "data.train_size=8"],
    "replay": ["algorithm.replay.enabled=true", "data.train_size=4", "algorithm.replay.trigger=tied"],
    "laser_d": ["algorithm=laser_d", "algorithm.shaping.adapt_every=1"],
    "hints": ["algorithm.hints.enabled=true", "algorithm.hints.placement=prefix", "algorithm.hints.anneal_steps=4"],
    "entropy_smoothing": ["algorithm=gigpo", "env=corridor", "algorithm.entropy_smoothing.coef=0.1"],
}


class Stopped(Exception):
    """Raised in place of the batch of a step the cut run never reaches (a crash after its checkpoint)."""


def stop_after(monkeypatch, last_step: int) -> None:
    """The next in-process run dies when its producer is asked for step last_step + 1 (its checkpoint at
    last_step is written): the first leg of a resume test, with the same config (steps=4) as the full run."""
    import rlx.cli.training as training

    build = training.build_parts

    def cut(cfg, components):
        parts = build(cfg, components)
        produce = parts.producer.produce

        def limited(step):
            if step > last_step:
                raise Stopped(step)
            return produce(step)

        parts.producer.produce = limited
        return parts

    monkeypatch.setattr(training, "build_parts", cut)


@pytest.mark.parametrize("option", [pytest.param(name, marks=pytest.mark.long) if name == "entropy_smoothing" else name
                                    for name in STATEFUL])
def test_resume_is_exact_for_stateful_options(tmp_path, option, monkeypatch):
    """3-10 s each (the agent case ~20 s, marked slow). 4 steps straight against the same run stopped after its step-2
    checkpoint and resumed:
    every logged value of the 4 steps equal (the prompt sampler's pass rates and generator, the replay buffer,
    LASER-D's targets and EPO's entropy history come back from the checkpoint; hints keep no state, their
    seeds and anneal follow the step)."""
    base = AGENT if option == "entropy_smoothing" else RUN
    overrides = [*STATEFUL[option], "checkpoint.every=2"]
    full = train(tmp_path, *overrides, base=base, steps=4, run_dir=tmp_path / "full")
    with monkeypatch.context() as patch:
        stop_after(patch, 2)
        with pytest.raises(Stopped):
            train(tmp_path, *overrides, base=base, steps=4, run_dir=tmp_path / "cut")
    resumed = train(tmp_path, *overrides, f"resume={tmp_path / 'cut'}", base=base, steps=4, run_dir=tmp_path / "cut")
    strip = lambda row: {k: v for k, v in row.items() if k != "time" and not k.startswith("perf/")}  # noqa: E731
    assert len(resumed) == len(full) == 4
    for step, (got, want) in enumerate(zip(resumed, full), start=1):
        assert strip(got) == strip(want), (step, {k: (got.get(k), want.get(k)) for k in strip(want)
                                                  if got.get(k) != want.get(k)})
