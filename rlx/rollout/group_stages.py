"""The seed ideas' stages of the single-turn producer (issue 29): what happens to one generation round between
scoring and dynamic sampling, with whole groups in view, and the per-prompt state those stages keep.

rlx/rollout/single_turn.py `sample_batch` calls `GroupStages.after_scoring` on every round, in this order:
  1. verifier noise (algorithm.verifier_noise): the accuracy component's verdict flipped at the configured
     rates, one counter-based uniform per sample (controlled studies of noisy verifiers);
  2. replay (algorithm.replay): the samples of informative groups go into a per-prompt buffer; a group that
     collapsed gets the newest buffered sample of the missing kind in place of its last sample (R^3 / Skywork's
     selective sample buffer);
  3. hints (algorithm.hints): a group that still fails entirely is re-sampled with a prefix of the row's
     reference solution, and the re-samples join their group (groups keyed by id, so sizes differ);
  4. group reward shaping (algorithm.shapers): the SHAPERS registry with correctness, lengths, the sampler's mean
     log-probs and, for PAR, the reward of the row's reference completion.
Dynamic sampling then drops the groups of algorithm.dynamic_sampling_drop (DROP_STRATEGIES). After the step's
last round, `after_step` updates the difficulty-aware prompt sampler (rlx/data/difficulty.py) and LASER-D's
targets. The state (prompt sampler, replay buffer, LASER-D targets) is checkpointed through
SingleTurnProducer.checkpointed(), so a resumed run continues exactly.

Everything here runs on one process (rlx/config/seed_rules.py refuses these knobs with hardware.num_processes > 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from rlx.algorithms.grouping import dense_ids, group_all
from rlx.algorithms.ngrpo import DROP_STRATEGIES
from rlx.algorithms.shaping import (
    SHAPERS,
    GroupSignals,
    LaserDTargets,
    correct_from_accuracy,
    inject_verifier_noise,
)
from rlx.rollout.hints import hint_fraction, hint_prefix, hinted_message, reference_solution
from rlx.rollout.prompts import format_prompts
from rlx.rollout.replay import TRIGGERS, ReplayBuffer, fill_buffer, replay_plan
from rlx.rollout.sampling import row_uniforms, sample_seed
from rlx.rollout.temperature import temperature_schedule
from rlx.rollout.types import Generation, Rollout

NOISE_POSITION = 1 << 20  # the noise uniform of sample i is row_uniforms(seed_i, this): no decoder position reaches it
HINT_INDEX = 1 << 30  # hint re-samples draw with sample_seed(seed, step, HINT_INDEX + ...): apart from the plain samples


@dataclass
class Round:
    """One generation round of the single-turn producer (n rows, the samples of a group adjacent).

    rollout: the training rows (the plain prompt + the completion; a hinted row's prompt too);
    rewards (n,) total reward; components {name: (n,)} each component's score of what the policy sampled;
    rows / prompts: the data row and the rendered plain prompt of each sample; groups (n,) long: group ids,
    unique over the step; correct (n,) bool: the verdict training sees (after verifier noise; replayed rows:
    the stored one); first_correct (n,): that verdict on the samples as drawn (before replay and hints), the
    pass rate the prompt sampler learns from; behaviour: the rows with the prompt each was sampled from
    (hinted rows: the hinted prompt), None when all were sampled from their own prompt; hinted (n,) bool."""

    rollout: Rollout
    rewards: torch.Tensor
    components: dict
    rows: list[dict]
    prompts: list[str]
    groups: torch.Tensor
    correct: torch.Tensor
    first_correct: torch.Tensor | None = None
    behaviour: Rollout | None = None
    hinted: torch.Tensor | None = None
    errors: int = 0

    def select(self, index: torch.Tensor) -> Round:
        take = [self.rows[i] for i in index.tolist()], [self.prompts[i] for i in index.tolist()]
        return Round(self.rollout.select(index), self.rewards[index], {k: v[index] for k, v in self.components.items()},
                     take[0], take[1], self.groups[index], self.correct[index],
                     self.first_correct[index] if self.first_correct is not None else None,
                     self.behaviour.select(index) if self.behaviour is not None else None,
                     self.hinted[index] if self.hinted is not None else None, self.errors)


@dataclass
class StageContext:
    """What a stage may call: the generator, tokenizer and scorer of the producer, and the step's seeds.
    score(prompts, rollout, rows) -> (total (n,), components {name: (n,)}, errors)."""

    generator: object
    tokenizer: object
    score: object
    step: int
    seed: int
    group_size: int
    max_new_tokens: int
    min_new_tokens: int
    use_chat_template: bool
    system_prompt: str | None
    completion_template: str | None
    schedule: list[float] | None = None


@dataclass
class StageCounts:
    """Sums over a step's rounds, turned into the step's mechanism metrics by GroupStages.after_step."""

    values: dict = field(default_factory=dict)
    averages: dict = field(default_factory=dict)  # metric -> [sum of value x samples, samples]

    def add(self, **counts) -> None:
        for name, value in counts.items():
            self.values[name] = self.values.get(name, 0.0) + float(value)

    def add_mean(self, name: str, value: float, samples: int) -> None:
        total = self.averages.setdefault(name, [0.0, 0])
        total[0] += float(value) * samples
        total[1] += samples

    def ratio(self, numerator: str, denominator: str) -> float:
        below = self.values.get(denominator, 0.0)
        return self.values.get(numerator, 0.0) / below if below else 0.0

    def means(self) -> dict:
        return {name: total / samples for name, (total, samples) in self.averages.items() if samples}


def mean_logprobs(rollout: Rollout) -> torch.Tensor | None:
    """(N,) mean sampler log-prob over each row's sampled tokens (None without sampler log-probs)."""
    if rollout.logprobs is None:
        return None
    mask = rollout.loss_mask.double()
    return (rollout.logprobs.double() * mask).sum(1) / mask.sum(1).clamp(min=1)


class GroupStages:
    """The configured stages (typed algorithm and rollout settings); `active` is False when every one is off."""

    def __init__(self, algo, roll, *, accuracy_key: str, accuracy_weight: float, group_size: int):
        self.accuracy_key, self.accuracy_weight = accuracy_key, accuracy_weight
        self.noise = algo.verifier_noise if (algo.verifier_noise.fn_rate or algo.verifier_noise.fp_rate) else None
        self.replay = algo.replay if algo.replay.enabled else None
        self.buffer = ReplayBuffer(algo.replay.per_prompt, algo.replay.max_age) if self.replay else None
        self.hints = algo.hints if algo.hints.enabled else None
        self.shapers = list(algo.shapers)
        self.shaping = dict(vars(algo.shaping)) if not isinstance(algo.shaping, dict) else dict(algo.shaping)
        self.shaping["eps"] = algo.eps
        self.drop = algo.dynamic_sampling_drop
        self.laser_d = (LaserDTargets(self.shaping["target_tokens"], self.shaping["target_candidates"], group_size,
                                      self.shaping["adapt_every"], self.shaping["expected_correct"])
                        if any(SHAPERS.needs(name).length_targets for name in self.shapers) else None)
        self.schedule_mode = roll.temperature_schedule.mode
        self.schedule_knobs = {k: v for k, v in vars(roll.temperature_schedule).items() if k != "mode"}
        self.base_temperature = roll.temperature
        self.prompt_sampling = algo.prompt_sampling.mode
        self.counts = StageCounts()

    def describe(self) -> list[str]:
        """The stages switched on, for the builder's log line."""
        on = [("verifier noise", self.noise), ("replay", self.replay), ("hints", self.hints),
              (f"shapers {'+'.join(self.shapers)}", self.shapers), (f"drop {self.drop}", self.drop != "tied"),
              (f"temperature {self.schedule_mode}", self.schedule_mode != "constant"),
              (f"prompt sampling {self.prompt_sampling}", self.prompt_sampling != "uniform")]
        return [name for name, enabled in on if enabled]

    @property
    def active(self) -> bool:
        return bool(self.describe())

    def checkpointed(self) -> dict:
        """Per-prompt / per-run state for Checkpointer.restore (empty when the stages keep none)."""
        state = {}
        if self.buffer is not None:
            state["replay"] = self.buffer
        if self.laser_d is not None:
            state["laser_d"] = self.laser_d
        return state

    def schedule(self, step: int, max_new_tokens: int) -> list[float] | None:
        """The per-position sampling temperatures of this step (EAD), or None for the constant temperature."""
        if self.schedule_mode == "constant":
            return None
        return temperature_schedule(self.schedule_mode, max_new_tokens, step, self.base_temperature,
                                    self.schedule_knobs).tolist()

    # ---- one round ------------------------------------------------------------------------------------------

    def after_scoring(self, part: Round, ctx: StageContext, first_index: int) -> Round:
        """Noise, replay, hints and shaping of one round (see the module docstring); `first_index`: the global
        index of the round's first sample (the sampling seeds' counter)."""
        part = self._verifier_noise(part, ctx, first_index)
        part.first_correct = part.correct.clone()
        if self.replay is not None:
            part = self._replay(part, ctx)
        if self.hints is not None:
            part = self._hint(part, ctx)
        if self.shapers:
            part = self._shape(part, ctx)
        if ctx.schedule is not None:
            taus = part.rollout.temperatures
            if part.rollout.scheduled:
                sampled = part.rollout.loss_mask.bool()
                self.counts.add(tau_sum=taus[sampled].double().sum().item(), tau_tokens=int(sampled.sum()))
        return part

    def dropped(self, part: Round) -> torch.Tensor:
        """(n,) bool: the samples of the groups dynamic sampling drops (DROP_STRATEGIES[algorithm.dynamic_sampling_drop])."""
        return DROP_STRATEGIES[self.drop](part.rewards, part.correct, part.groups)

    def _verifier_noise(self, part: Round, ctx: StageContext, first_index: int) -> Round:
        accuracy = part.components[self.accuracy_key]
        clean = correct_from_accuracy(accuracy)
        part.correct = clean
        if self.noise is None:
            return part
        seeds = torch.tensor([sample_seed(ctx.seed, ctx.step, first_index + i) for i in range(len(clean))], dtype=torch.int64)
        observed = inject_verifier_noise(clean, self.noise.fn_rate, self.noise.fp_rate, row_uniforms(seeds, NOISE_POSITION))
        flipped = observed != clean
        delta = self.accuracy_weight * (observed.double() - torch.nan_to_num(accuracy.double(), nan=0.0))
        part.rewards = torch.where(flipped, part.rewards + delta.to(part.rewards.dtype), part.rewards)
        part.correct = observed
        self.counts.add(noise_flipped=int(flipped.sum()), noise_samples=len(clean), noise_observed=int(observed.sum()))
        return part

    def _keys(self, part: Round) -> list[str]:
        """The prompt key of each group, in order of first appearance (the rendered prompt)."""
        index, count = dense_ids(part.groups)
        first = torch.full((count,), len(part.prompts), dtype=torch.long).scatter_reduce(
            0, index, torch.arange(len(part.prompts)), reduce="amin")
        order = torch.argsort(first)
        return [part.prompts[int(first[g])] for g in order.tolist()]

    def _replay(self, part: Round, ctx: StageContext) -> Round:
        keys = self._keys(part)
        plan = replay_plan(part.correct, part.groups, keys, self.buffer, ctx.step, self.replay.trigger)
        rollout = part.rollout
        completions = [ids[mask.bool()].tolist() for ids, mask in zip(rollout.completion_ids, rollout.loss_mask)]
        logprobs = ([lp[mask.bool()].tolist() for lp, mask in zip(rollout.logprobs, rollout.loss_mask)]
                    if rollout.logprobs is not None else None)
        wanted = TRIGGERS[self.replay.trigger](group_all(part.correct, part.groups), group_all(~part.correct, part.groups))
        collapsed = torch.unique(part.groups[wanted >= 0]).numel()  # groups the trigger asks a replayed sample for
        stored = fill_buffer(self.buffer, part.correct, part.groups, keys, completions, part.rewards, ctx.step, logprobs,
                             truncated=rollout.truncated.tolist())
        self.counts.add(replay_collapsed=collapsed, replay_filled=len(plan), replay_stored=stored)
        if not plan:
            return part
        pad = ctx.tokenizer.pad_token_id
        prompt_ids = [rollout.prompt_ids[row][rollout.prompt_mask[row].bool()].tolist() for row, _ in plan]
        replayed = [entry for _, entry in plan]
        out = Generation([e.completion_ids for e in replayed],
                         [list(e.logprobs) for e in replayed] if all(e.logprobs is not None for e in replayed) else None,
                         [not e.truncated for e in replayed])
        texts = ctx.tokenizer.batch_decode([e.completion_ids for e in replayed], skip_special_tokens=True)
        fresh = Rollout.from_ids(prompt_ids, out, 1, pad, texts, [max(e.step - 1, 0) for e in replayed])  # its sampler
        if rollout.logprobs is not None and fresh.logprobs is None:
            fresh = replace(fresh, logprobs=torch.zeros(fresh.completion_ids.shape))
        merged = Rollout.cat([rollout, fresh], pad)
        order = torch.arange(len(rollout))
        for position, (row, entry) in enumerate(plan):
            order[row] = len(rollout) + position
            part.rewards[row] = entry.reward
            part.correct[row] = entry.correct
        part.rollout = merged.select(order)
        return part

    def _hint(self, part: Round, ctx: StageContext) -> Round:
        hints = self.hints
        fraction = hint_fraction(ctx.step, hints.fraction_start, hints.fraction_end, hints.anneal_steps)
        failed = group_all(~part.correct.bool(), part.groups)  # (n,)
        index, count = dense_ids(part.groups)
        first_rows = torch.full((count,), len(part.rows), dtype=torch.long).scatter_reduce(
            0, index, torch.arange(len(part.rows)), reduce="amin")
        chosen = []  # (dense group, first row, prefix ids)
        for dense in torch.argsort(first_rows).tolist():
            row = int(first_rows[dense])
            if not bool(failed[row]):
                continue
            solution = reference_solution(part.rows[row], hints.source, hints.column, ctx.completion_template)
            ids = ctx.tokenizer(solution, add_special_tokens=False)["input_ids"] if solution is not None else None
            prefix = hint_prefix(ids, fraction)
            if prefix is not None:
                chosen.append((dense, row, prefix))
        all_fail = int(torch.unique(part.groups[failed]).numel())
        self.counts.add(hint_all_fail=all_fail, hint_fraction_sum=fraction, hint_rounds=1)
        if not chosen:
            return part
        samples, pad = hints.samples, ctx.tokenizer.pad_token_id
        rollout = part.rollout
        plain_ids = [rollout.prompt_ids[row][rollout.prompt_mask[row].bool()].tolist() for _, row, _ in chosen]
        seeds = [sample_seed(ctx.seed, ctx.step, HINT_INDEX + int(part.groups[row]) * samples + j)
                 for _, row, _ in chosen for j in range(samples)]
        if hints.placement == "prompt":  # Guide: the hint in the user message; trained in the plain context
            hinted_rows = [_with_hint(part.rows[row], ctx.tokenizer.decode(prefix), hints.template) for _, row, prefix in chosen]
            texts = format_prompts(ctx.tokenizer, hinted_rows, ctx.use_chat_template, ctx.system_prompt)
            contexts = ctx.tokenizer(texts, add_special_tokens=False)["input_ids"]
            budget = ctx.max_new_tokens
        else:  # "prefix": continuation from a token prefix (the plain prompt + the first tokens of the solution)
            contexts = [ids + prefix for ids, (_, _, prefix) in zip(plain_ids, chosen)]
            budget = max(1, ctx.max_new_tokens - max(len(prefix) for _, _, prefix in chosen))
        extra = {"schedule": ctx.schedule} if ctx.schedule is not None else {}
        out = ctx.generator.generate_ids(contexts, max_new_tokens=budget, seeds=seeds, samples_per_prompt=samples,
                                         min_new_tokens=min(ctx.min_new_tokens, budget), **extra)
        prefixes = [prefix for _, _, prefix in chosen for _ in range(samples)]
        if hints.placement == "prefix":  # the row's completion holds the prefix (not trained) and the continuation
            out = Generation([p + ids for p, ids in zip(prefixes, out.ids)],
                             [[0.0] * len(p) + lp for p, lp in zip(prefixes, out.logprobs)] if out.logprobs is not None else None,
                             out.stopped)
        texts = ctx.tokenizer.batch_decode(_padded(out.ids, pad), skip_special_tokens=True)
        trained = Rollout.from_ids(plain_ids, out, samples, pad, texts, version=getattr(ctx.generator, "version", 0))
        skip = [len(p) for p in prefixes] if hints.placement == "prefix" else [0] * len(prefixes)
        loss_mask = trained.completion_mask.clone()
        for r, n in enumerate(skip):
            loss_mask[r, :n] = 0
        taus = trained.temperatures
        if ctx.schedule is not None:
            width = trained.completion_ids.shape[1]
            taus = torch.ones(len(trained), width)
            for r, n in enumerate(skip):  # the continuation's position t was drawn at schedule[t]
                length = int(trained.completion_mask[r].sum()) - n
                taus[r, n : n + length] = torch.tensor(ctx.schedule[:length], dtype=torch.float32)
        trained = replace(trained, loss_mask=loss_mask, step_index=torch.where(loss_mask.bool(), 0, -1), temperatures=taus)
        rows = [part.rows[row] for _, row, _ in chosen for _ in range(samples)]
        prompts = [part.prompts[row] for _, row, _ in chosen for _ in range(samples)]
        total, components, errors = ctx.score(prompts, trained, rows)
        correct = correct_from_accuracy(components[self.accuracy_key])
        groups = torch.tensor([int(part.groups[row]) for _, row, _ in chosen for _ in range(samples)], dtype=torch.long)
        rescued = int(torch.unique(groups[correct]).numel())
        self.counts.add(hint_groups=len(chosen), hint_rescued=rescued, hint_samples=len(rows))
        behaviour = None
        if hints.placement == "prompt":  # the same completions after the hinted prompt: old and sampler log-probs
            behaviour = Rollout.from_ids(contexts, out, samples, pad, texts, version=getattr(ctx.generator, "version", 0))
            behaviour = replace(behaviour, temperatures=trained.temperatures)
            behaviour = Rollout.cat([part.rollout if part.behaviour is None else part.behaviour, behaviour], pad)
        elif part.behaviour is not None:
            behaviour = Rollout.cat([part.behaviour, trained], pad)
        merged = Round(Rollout.cat([part.rollout, trained], pad), torch.cat([part.rewards, total.to(part.rewards.dtype)]),
                       {k: torch.cat([v, components[k]]) for k, v in part.components.items()}, part.rows + rows,
                       part.prompts + prompts, torch.cat([part.groups, groups]), torch.cat([part.correct, correct]),
                       torch.cat([part.first_correct, correct]), behaviour,
                       torch.cat([part.hinted if part.hinted is not None else torch.zeros(len(part.rows), dtype=torch.bool),
                                  torch.ones(len(rows), dtype=torch.bool)]), part.errors + errors)
        order = torch.sort(merged.groups, stable=True).indices  # each group's hinted rows right after its own
        return merged.select(order)

    def _shape(self, part: Round, ctx: StageContext) -> Round:
        reference = None
        if any(SHAPERS.needs(name).reference_rewards for name in self.shapers):  # r(x, y_ref): the reward of the row's reference completion (data.completion_template)
            texts = [ctx.completion_template.format(answer=row.get("answer")) for row in part.rows]
            reference = _reference_rewards(ctx, part, texts)
        signals = GroupSignals(part.groups, part.correct, part.rollout.lengths, mean_logprobs(part.rollout), reference,
                               self.accuracy_weight, ctx.max_new_tokens, ctx.step)
        knobs = dict(self.shaping)
        if self.laser_d is not None:
            knobs["bucket_targets"] = tuple(self.laser_d.targets.tolist())
        rewards = part.rewards
        for name in self.shapers:  # in the configured order, each on the previous one's output
            shaped, metrics = SHAPERS[name](rewards, signals, **knobs)
            # the generic mechanism metric of every shaper: how far it moved the rewards
            self.counts.add_mean(f"shaping/{name}_delta_abs", (shaped.double() - rewards.double()).abs().mean().item(),
                                 len(rewards))
            for key, value in metrics.items():
                if value is not None:
                    self.counts.add_mean(key, value, len(rewards))
            rewards = shaped
        if reference is not None:
            self.counts.add(par_reference_sum=reference.double().sum().item(), par_reference_n=len(reference))
        part.rewards = rewards.to(part.rewards.dtype)
        return part

    # ---- after the step's rounds ----------------------------------------------------------------------------

    def after_step(self, parts: list[Round], stream, step: int) -> dict:
        """Update the prompt sampler (pass rates of the prompts drawn, as first sampled) and LASER-D's targets
        (on every row drawn this step); return the step's mechanism metrics and reset the counts."""
        metrics = {}
        if hasattr(stream, "update") and hasattr(stream, "drawn"):
            rates, solved = [], []
            for part in parts:
                plain = ~part.hinted if part.hinted is not None else torch.ones(len(part.groups), dtype=torch.bool)
                groups, correct = part.groups[plain], part.first_correct[plain].double()
                for g in torch.unique_consecutive(groups).tolist():
                    chosen = correct[groups == g]
                    rates.append(chosen.mean().item())
                    solved.append(bool(chosen.all()))
            drawn = list(stream.drawn)
            estimates = stream.pass_rates[torch.tensor(drawn, dtype=torch.long)] if drawn else torch.zeros(0)
            metrics["sampling/drawn_pass_estimate"] = estimates.mean().item() if drawn else 0.0
            stream.update(drawn, torch.tensor(rates, dtype=torch.float64), torch.tensor(solved, dtype=torch.bool))
            metrics["sampling/retired"] = int(stream.retired.sum())
        if self.laser_d is not None:
            lengths = torch.cat([p.rollout.lengths for p in parts])
            correct = torch.cat([p.correct for p in parts])
            groups = torch.cat([p.groups for p in parts])
            self.laser_d.update(step, lengths, correct, groups)
        counts = self.counts
        if self.noise is not None:
            metrics["noise/flipped_frac"] = counts.ratio("noise_flipped", "noise_samples")
            metrics["noise/observed_accuracy"] = counts.ratio("noise_observed", "noise_samples")
        if self.replay is not None:
            metrics["replay/filled_frac"] = counts.ratio("replay_filled", "replay_collapsed")  # collapsed groups replayed into
            metrics["replay/groups_filled"] = counts.values.get("replay_filled", 0.0)
            metrics["replay/buffer_size"] = len(self.buffer)
        if self.hints is not None:
            metrics["hints/all_fail_groups"] = counts.values.get("hint_all_fail", 0.0)
            metrics["hints/hinted_groups"] = counts.values.get("hint_groups", 0.0)
            metrics["hints/rescued_frac"] = counts.ratio("hint_rescued", "hint_all_fail")  # all-fail groups rescued
            metrics["hints/fraction"] = counts.ratio("hint_fraction_sum", "hint_rounds")
        metrics.update(counts.means())
        if "par_reference_n" in counts.values:
            metrics["shaping/par_reference_reward"] = counts.ratio("par_reference_sum", "par_reference_n")
        if "tau_tokens" in counts.values:
            metrics["rollout/temperature_mean"] = counts.ratio("tau_sum", "tau_tokens")
        self.counts = StageCounts()
        return metrics


def _with_hint(row: dict, hint: str, template: str) -> dict:
    """The data row with the hint in its user message (a chat list: in its last user message)."""
    prompt = row["prompt"]
    if isinstance(prompt, list):
        messages = [dict(m) for m in prompt]
        last = max(i for i, m in enumerate(messages) if m.get("role") == "user")
        messages[last]["content"] = hinted_message(messages[last]["content"], hint, template)
        return dict(row, prompt=messages)
    return dict(row, prompt=hinted_message(prompt, hint, template))


def _padded(ids: list[list[int]], pad: int) -> torch.Tensor:
    width = max((len(r) for r in ids), default=0)
    out = torch.full((len(ids), width), pad, dtype=torch.long)
    for row, values in enumerate(ids):
        out[row, : len(values)] = torch.tensor(values, dtype=torch.long)
    return out


def _reference_rewards(ctx: StageContext, part: Round, texts: list[str]) -> torch.Tensor:
    """(n,) the total reward of each sample's reference completion, scored once per group."""
    index, count = dense_ids(part.groups)
    first = torch.full((count,), len(texts), dtype=torch.long).scatter_reduce(0, index, torch.arange(len(texts)), reduce="amin")
    rows = first.tolist()
    tokenizer = ctx.tokenizer
    ids = [tokenizer(texts[r], add_special_tokens=False)["input_ids"] for r in rows]
    prompt_ids = [part.rollout.prompt_ids[r][part.rollout.prompt_mask[r].bool()].tolist() for r in rows]
    reference = Rollout.from_ids(prompt_ids, Generation(ids, None, [True] * len(ids)), 1, tokenizer.pad_token_id,
                                 [texts[r] for r in rows])
    total, _, _ = ctx.score([part.prompts[r] for r in rows], reference, [part.rows[r] for r in rows])
    return total.double()[index]
