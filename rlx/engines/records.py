"""The records sampling produces: a generator's reply (`Generation`), the padded sequences every loop trains on
(`Rollout`) and how an episode was played (`Episode`).

`Rollout` holds N sequences as padded tensors. A sequence is a prompt and everything after it: the tokens the
model sampled and, in a multi-turn episode, the environment's (or a tool's, or a harness's user turns') tokens
between the model's turns. Two masks tell them apart: `completion_mask` is the attention mask of everything
after the prompt, `loss_mask` marks the tokens the model sampled (the only ones trained). `step_index` gives
the turn each sampled token belongs to, so per-turn advantages reach their tokens. Single-turn sampling is the
case of one turn and no environment tokens (loss_mask == completion_mask, step_index 0 on every sampled
token), as in verl's AgentLoopOutput (`response_mask = [1] * n`). Every field is set at construction and the
record is frozen (no field means something by being None, except Rollout.logprobs: the generator was not asked
for them).

`Episode` is how an episode was played, turn by turn (unpadded lists: ids, rewards, anchors, actions,
observations); the episode producer fills one per environment and `Rollout.from_episodes` pads them.

They live with the engines (the lowest of the three generation packages) because an engine returns them; the
step record a producer hands the update (`Batch`) is rlx.rollout.types.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Generation:
    """What a Generator returns for a batch of token-id prompts (one entry per prompt row)."""

    ids: list[list[int]]            # sampled token ids, exactly as drawn, up to and including the stop token
    logprobs: list[list[float]] | None  # log-prob of each sampled id under the sampling distribution (None: not asked)
    stopped: list[bool]             # True when a stop token ended the row (False: the budget ran out)


@dataclass(frozen=True, eq=False)
class Rollout:
    """N sequences for a forward pass (rlx.models.forward.completion_logprobs) and their bookkeeping. Every field
    is set at construction (the factories `single_turn`, `from_ids`, `from_episodes`) and never assigned after:
    a changed record is a new one (dataclasses.replace).

    prompt_ids / prompt_mask (N, P) left-padded; completion_ids (N, C) right-padded: every token after the
    prompt (model AND environment tokens); completion_mask (N, C) its attention mask (1 up to and including
    the first stop token of a single-turn sample); truncated (N,) bool (no stop token within the budget, or an
    episode cut by a limit); texts: the decoded completions (special tokens removed); logprobs (N, C) the
    sampler's log-prob of each sampled token (0 elsewhere), or None when the generator was not asked for them;
    loss_mask (N, C) 1 on the tokens the model sampled only; step_index (N, C) long: the turn each sampled token
    belongs to (-1 elsewhere); versions (N,) long: the policy version (number of updates published to the
    generator) that sampled each row, its oldest where the row spans several (partial rollouts); token_versions
    (N, C) long: the version that sampled each token (-1 where the model sampled none); temperatures: (N, C) the
    temperature each token was sampled at when it varies within a generation (rollout.temperature_schedule, EAD), which
    the trainer's log-probs then use too, or an empty (N, 0) when every token was sampled at rollout.temperature
    (`scheduled` tells them apart)."""

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    truncated: torch.Tensor
    texts: list[str]
    logprobs: torch.Tensor | None
    loss_mask: torch.Tensor
    step_index: torch.Tensor
    versions: torch.Tensor
    token_versions: torch.Tensor
    temperatures: torch.Tensor

    @classmethod
    def single_turn(cls, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                    completion_mask: torch.Tensor, truncated: torch.Tensor, texts: list[str],
                    logprobs: torch.Tensor | None, version: int | list[int] | list[list[int]] = 0) -> Rollout:
        """Single-turn rows: every token after the prompt was sampled (loss_mask = completion_mask, step_index 0 on
        it) at the constant temperature, by policy version `version`: one for every row, one per row, or one list
        per row with each sampled token's (a row continued across versions, rollout.partial)."""
        rows = completion_ids.shape[0]
        versions, token_versions = version_tensors(version, completion_mask)
        return cls(prompt_ids, prompt_mask, completion_ids, completion_mask, truncated, texts, logprobs,
                   completion_mask, torch.where(completion_mask.bool(), 0, -1), versions, token_versions,
                   constant_temperature(rows))

    def __setstate__(self, state: dict) -> None:
        """Unpickling (pipeline checkpoints hold queued batches): a record saved before token_versions existed
        gets each row's version on its sampled tokens."""
        if "token_versions" not in state:
            state["token_versions"] = torch.where(state["loss_mask"].bool(), state["versions"].unsqueeze(1), -1)
        for key, value in state.items():
            object.__setattr__(self, key, value)

    @property
    def scheduled(self) -> bool:
        """True when `temperatures` holds each token's sampling temperature (EAD); False: rollout.temperature."""
        return self.temperatures.shape[1] > 0

    @property
    def lengths(self) -> torch.Tensor:
        return self.completion_mask.sum(dim=1)  # (N,)

    def __len__(self) -> int:
        return self.completion_ids.shape[0]

    @classmethod
    def from_ids(cls, prompt_ids: list[list[int]], out: Generation, group: int, pad_id: int, texts: list[str],
                 version: int | list[int] | list[list[int]] = 0) -> Rollout:
        """Single-turn rows from token-id prompts and the generator's reply: G = group adjacent samples per prompt,
        prompts left-padded (N, P), completions right-padded (N, C) to the longest one, mask 1 up to and including
        the stop token, truncated where no stop token ended the row, the sampler's log-probs when returned, the
        policy version that sampled them (as single_turn's `version`)."""
        rows = len(prompt_ids) * group
        width_p = max((len(p) for p in prompt_ids), default=0)
        width_c = max((len(c) for c in out.ids), default=0)
        p_ids = torch.full((rows, width_p), pad_id, dtype=torch.long)  # (N, P)
        p_mask = torch.zeros((rows, width_p), dtype=torch.long)  # (N, P)
        c_ids = torch.full((rows, width_c), pad_id, dtype=torch.long)  # (N, C)
        c_mask = torch.zeros((rows, width_c), dtype=torch.long)  # (N, C)
        logprobs = torch.zeros((rows, width_c)) if out.logprobs is not None else None  # (N, C)
        for row in range(rows):
            ids, sampled = prompt_ids[row // group], out.ids[row]
            if ids:
                p_ids[row, width_p - len(ids):] = torch.tensor(ids, dtype=torch.long)
                p_mask[row, width_p - len(ids):] = 1
            if sampled:
                c_ids[row, : len(sampled)] = torch.tensor(sampled, dtype=torch.long)
                c_mask[row, : len(sampled)] = 1
                if logprobs is not None:
                    logprobs[row, : len(sampled)] = torch.tensor(out.logprobs[row], dtype=torch.float32)
        truncated = torch.tensor([not s for s in out.stopped], dtype=torch.bool)  # (N,)
        return cls.single_turn(p_ids, p_mask, c_ids, c_mask, truncated, texts, logprobs, version)

    @classmethod
    def from_episodes(cls, episodes: list[Episode], pad_id: int, versions: list[int] | None = None) -> Rollout:
        """One row per episode: its first prompt, then every later token (model turns with loss mask 1,
        environment answers with 0); the sampler's log-probs; the turn of each sampled token."""
        n = len(episodes)
        p = max(1, max((len(e.prompt_ids) for e in episodes), default=1))
        c = max(1, max((len(e.ids) for e in episodes), default=1))
        prompt_ids = torch.full((n, p), pad_id, dtype=torch.long)
        prompt_mask = torch.zeros((n, p), dtype=torch.long)
        completion_ids = torch.full((n, c), pad_id, dtype=torch.long)
        completion_mask = torch.zeros((n, c), dtype=torch.long)
        loss_mask = torch.zeros((n, c), dtype=torch.long)
        logprobs = torch.zeros((n, c))
        step_index = torch.full((n, c), -1, dtype=torch.long)
        for row, e in enumerate(episodes):
            if e.prompt_ids:
                prompt_ids[row, p - len(e.prompt_ids):] = torch.tensor(e.prompt_ids)
                prompt_mask[row, p - len(e.prompt_ids):] = 1
            k = len(e.ids)
            if k:
                completion_ids[row, :k] = torch.tensor(e.ids)
                completion_mask[row, :k] = 1
                loss_mask[row, :k] = torch.tensor(e.loss_mask)
                logprobs[row, :k] = torch.tensor(e.logprobs)
            for turn, (start, end) in enumerate(e.turn_spans):
                step_index[row, start:end] = turn
            step_index[row] = torch.where(loss_mask[row].bool(), step_index[row], -1)
        truncated = torch.tensor([e.truncated for e in episodes], dtype=torch.bool)
        texts = [" | ".join(e.actions) for e in episodes]
        version_tensor = torch.tensor(versions if versions is not None else [0] * n, dtype=torch.long)
        token_versions = torch.where(loss_mask.bool(), version_tensor.unsqueeze(1), -1)  # (n, c)
        return cls(prompt_ids, prompt_mask, completion_ids, completion_mask, truncated, texts, logprobs, loss_mask,
                   step_index, version_tensor, token_versions, constant_temperature(n))

    def select(self, index: torch.Tensor) -> Rollout:
        """The rows `index` (1-D long tensor), in that order."""
        take = lambda t: t[index] if t is not None else None  # noqa: E731
        return Rollout(take(self.prompt_ids), take(self.prompt_mask), take(self.completion_ids),
                       take(self.completion_mask), take(self.truncated), [self.texts[i] for i in index.tolist()],
                       take(self.logprobs), take(self.loss_mask), take(self.step_index), take(self.versions),
                       take(self.token_versions), take(self.temperatures))

    @staticmethod
    def cat(parts: list[Rollout], pad_id: int) -> Rollout:
        """Rows of several rollouts in order (prompts stay left-padded, completions right-padded)."""
        if len(parts) == 1:
            return parts[0]
        p_width = max(r.prompt_ids.shape[1] for r in parts)
        c_width = max(r.completion_ids.shape[1] for r in parts)

        def pad(tensor, width, value, left):
            missing = width - tensor.shape[1]
            if missing == 0:
                return tensor
            filler = torch.full((tensor.shape[0], missing), value, dtype=tensor.dtype)
            return torch.cat([filler, tensor] if left else [tensor, filler], dim=1)

        logprobs = (torch.cat([pad(r.logprobs, c_width, 0, False) for r in parts])  # (N, C)
                    if all(r.logprobs is not None for r in parts) else None)
        temperatures = (torch.cat([pad(r.temperatures, c_width, 1.0, False) for r in parts])  # (N, C)
                        if all(r.scheduled for r in parts) else constant_temperature(sum(len(r) for r in parts)))
        return Rollout(
            torch.cat([pad(r.prompt_ids, p_width, pad_id, True) for r in parts]),  # (N, P)
            torch.cat([pad(r.prompt_mask, p_width, 0, True) for r in parts]),  # (N, P)
            torch.cat([pad(r.completion_ids, c_width, pad_id, False) for r in parts]),  # (N, C)
            torch.cat([pad(r.completion_mask, c_width, 0, False) for r in parts]),  # (N, C)
            torch.cat([r.truncated for r in parts]),
            [t for r in parts for t in r.texts],
            logprobs,
            torch.cat([pad(r.loss_mask, c_width, 0, False) for r in parts]),  # (N, C)
            torch.cat([pad(r.step_index, c_width, -1, False) for r in parts]),  # (N, C)
            torch.cat([r.versions for r in parts]),
            torch.cat([pad(r.token_versions, c_width, -1, False) for r in parts]),  # (N, C)
            temperatures,
        )


def version_tensors(version: int | list[int] | list[list[int]],
                    mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(versions (N,), token_versions (N, C)) of rows whose sampled tokens are `mask` (N, C): `version` is one
    for every row, one per row, or one list per row of each sampled token's version (a row's version is then its
    oldest token's; a list shorter than the row's tokens is the newest tokens', its first value repeated before)."""
    rows = mask.shape[0]
    if isinstance(version, int) or (version and not isinstance(version[0], list)) or not version:
        versions = (torch.full((rows,), version, dtype=torch.long) if isinstance(version, int)
                    else torch.tensor(list(version) or [0] * rows, dtype=torch.long))  # (N,)
        return versions, torch.where(mask.bool(), versions.unsqueeze(1), -1)
    tokens = torch.full(mask.shape, -1, dtype=torch.long)  # (N, C)
    for row, values in enumerate(version):
        count = int(mask[row].sum())
        values = ([values[0]] * (count - len(values)) + list(values)[-count:]) if values and count else []
        tokens[row, :count] = torch.tensor(values, dtype=torch.long) if count else tokens[row, :0]
    versions = torch.tensor([min(v) if v else 0 for v in version], dtype=torch.long)  # (N,)
    return versions, tokens


def constant_temperature(rows: int) -> torch.Tensor:
    """Rollout.temperatures of rows sampled at the constant rollout.temperature: an empty (N, 0)."""
    return torch.ones((rows, 0))


@dataclass
class Episode:
    """One episode as it was played, token by token (lists, no padding)."""

    prompt_ids: list[int]                                        # the first prompt (system + first observation)
    ids: list[int] = field(default_factory=list)                 # everything after the prompt
    loss_mask: list[int] = field(default_factory=list)           # 1 on sampled tokens, 0 on environment tokens
    logprobs: list[float] = field(default_factory=list)          # sampler log-prob (0.0 on environment tokens)
    turn_spans: list[tuple[int, int]] = field(default_factory=list)  # [start, end) of each model turn in `ids`
    step_rewards: list[float] = field(default_factory=list)      # reward after each turn
    anchors: list = field(default_factory=list)                  # state key the turn was taken in (None: none)
    valid: list[bool] = field(default_factory=list)              # info["is_action_valid"] of each turn
    actions: list[str] = field(default_factory=list)             # decoded text of each turn (what the env saw)
    observations: list[str] = field(default_factory=list)        # first observation, then each answer shown
    metrics: dict = field(default_factory=dict)                  # last info["metrics"] of the episode
    terminated: bool = False                                     # the environment ended the episode
    truncated: bool = False                                      # cut: env truncation, max_turns, budgets, errors
    budget_cut: bool = False                                     # ended by max_total_tokens (no room for a turn)
    turn_truncated: int = 0                                      # turns that hit the per-turn token budget
    error: str | None = None                                     # what went wrong, when the env failed
    versions: list[int] = field(default_factory=list)            # policy version that sampled each turn (gateway)
    # other rows of a harness session (rlx/gateway/episodes.py)
    forks: list = field(default_factory=list)

    @property
    def success(self) -> float:
        return float(self.metrics.get("success", float(sum(self.step_rewards) > 0)))
