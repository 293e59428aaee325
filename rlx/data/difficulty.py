"""Difficulty-aware prompt sampling: a per-prompt pass-rate estimate decides which training prompts are drawn.

The seeds (DRIVE, SwS, V0 / V0.5, The Reasoning Boundary Paradox; listings 000-003) weight prompts by an
estimate of how often the policy solves them; their exact weightings differ and the abstracts do not give
them, so rlx offers the generic form (a reconstruction, see docs/algorithms/seed-ideas.md):
    p_x <- (1 - eta) p_x + eta * mean(group rewards of x)      (unseen prompts start at the prior)
    P(draw x) proportional to f(p_x) + eps,  f from SAMPLING_WEIGHTS
    retire_after = n > 0: a prompt solved by every sample n times in a row is no longer drawn.
Only the training rows are in the sampler: the held-out split is never touched. The whole state (pass
rates, streaks, the random generator) round-trips through state_dict exactly, so a resumed run draws what
the uninterrupted one would.
"""

from __future__ import annotations

import torch

from rlx.registry import Registry, publish

# f(p): the unnormalised weight of a prompt with estimated pass rate p (tensor in, tensor out)
SAMPLING_WEIGHTS = publish("prompt_sampling", Registry("prompt sampling mode"))
SAMPLING_WEIGHTS.register("uniform")(lambda p: torch.ones_like(p))
SAMPLING_WEIGHTS.register("learnability")(lambda p: p * (1 - p))  # peaks at p = 1/2, where GRPO's signal is largest
SAMPLING_WEIGHTS.register("hard")(lambda p: 1 - p)  # hard focus (DRIVE-style)


def sampling_weights(pass_rates: torch.Tensor, mode: str, eps: float,
                     retired: torch.Tensor | None = None) -> torch.Tensor:
    """w_x = f(p_x) + eps, 0 for retired prompts. Example (learnability, eps 0.01): p = [0, 0.5, 1] ->
    [0.01, 0.26, 0.01]. pass_rates: (P,). Returns (P,) float64 (not normalised)."""
    weights = SAMPLING_WEIGHTS[mode](pass_rates.double()) + eps
    return weights.masked_fill(retired, 0.0) if retired is not None else weights


class DifficultySampler:
    """Draws training rows by weight; a drop-in for PromptStream.take (the rows drawn by the last `take`
    calls are remembered in `drawn`, in order, for `update`)."""

    def __init__(self, rows: list[dict], seed: int, mode: str = "uniform", ema: float = 0.5, eps: float = 0.01,
                 prior: float = 0.5, retire_after: int = 0):
        if not rows:
            raise ValueError("the difficulty sampler needs at least one training row")
        SAMPLING_WEIGHTS[mode]  # an unknown mode fails here, listing the valid ones
        self.rows, self.mode, self.ema, self.eps, self.retire_after = rows, mode, ema, eps, retire_after
        self.pass_rates = torch.full((len(rows),), float(prior), dtype=torch.float64)
        self.streaks = torch.zeros(len(rows), dtype=torch.long)  # consecutive fully solved groups
        self.retired = torch.zeros(len(rows), dtype=torch.bool)
        self.generator = torch.Generator().manual_seed(seed)
        self.drawn: list[int] = []

    def weights(self) -> torch.Tensor:
        """(P,) draw probabilities (normalised). If every prompt is retired, all return (uniform)."""
        weights = sampling_weights(self.pass_rates, self.mode, self.eps, self.retired)
        if weights.sum() <= 0:
            weights = torch.ones_like(weights)
        return weights / weights.sum()

    def draw(self, n: int) -> list[int]:
        """n row indices, without repetition within one call while enough prompts remain."""
        weights, picked = self.weights(), []
        while len(picked) < n:
            available = int((weights > 0).sum())
            take = min(n - len(picked), available)
            chosen = torch.multinomial(weights, take, replacement=False, generator=self.generator)
            picked += chosen.tolist()
        return picked

    def take(self, n: int) -> list[dict]:
        indices = self.draw(n)
        self.drawn += indices
        return [self.rows[i] for i in indices]

    def update(self, indices: list[int], group_rewards: torch.Tensor, solved: torch.Tensor | None = None) -> None:
        """After scoring: group_rewards (len(indices),) the mean reward (pass rate) of each drawn prompt's group;
        solved (len(indices),) bool: every sample correct (for retirement). A prompt drawn twice updates twice,
        in order."""
        for position, index in enumerate(indices):
            self.pass_rates[index] = (1 - self.ema) * self.pass_rates[index] + self.ema * float(group_rewards[position])
            if solved is not None and self.retire_after > 0:
                self.streaks[index] = self.streaks[index] + 1 if bool(solved[position]) else 0
                self.retired[index] = bool(self.streaks[index] >= self.retire_after)
        self.drawn = []

    def state_dict(self) -> dict:
        return {"pass_rates": self.pass_rates.tolist(), "streaks": self.streaks.tolist(),
                "retired": self.retired.tolist(),
                "generator": self.generator.get_state().tolist(), "drawn": list(self.drawn)}

    def load_state_dict(self, state: dict) -> None:
        if len(state["pass_rates"]) != len(self.rows):
            raise ValueError(f"the checkpointed prompt sampler has {len(state['pass_rates'])} prompts, the data "
                             f"{len(self.rows)}: resume with the data the run started with")
        self.pass_rates = torch.tensor(state["pass_rates"], dtype=torch.float64)
        self.streaks = torch.tensor(state["streaks"], dtype=torch.long)
        self.retired = torch.tensor(state["retired"], dtype=torch.bool)
        self.generator.set_state(torch.tensor(state["generator"], dtype=torch.uint8))
        self.drawn = list(state["drawn"])
