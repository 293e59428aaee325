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
    """Draws training rows by weight (the prompt source `difficulty`, rlx/data/sources.py): the rows handed out
    and not yet observed are remembered in `drawn`, in order, so `observe` credits each group to its prompt."""

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

    def observe(self, rows: list[dict], verdicts: list[torch.Tensor]) -> dict:
        """Learn from a step's groups: `rows` the data row of each (rows this sampler handed out), `verdicts` each
        group's (g,) bool verdicts. Each row is credited to its oldest draw not yet observed (the same row object
        first, else an equal row: a resumed pool holds copies), so groups may be observed in another order than
        drawn. Metrics: sampling/drawn_pass_estimate (the mean estimate of the observed prompts before this update),
        sampling/retired (prompts retired so far)."""
        indices = [self._pending(row) for row in rows]
        estimate = self.pass_rates[torch.tensor(indices, dtype=torch.long)].mean().item() if indices else 0.0
        rates = torch.tensor([v.double().mean().item() for v in verdicts], dtype=torch.float64)
        solved = torch.tensor([bool(v.all()) for v in verdicts], dtype=torch.bool)
        self.update(indices, rates, solved)
        return {"sampling/drawn_pass_estimate": estimate, "sampling/retired": int(self.retired.sum())}

    def _pending(self, row: dict) -> int:
        """The row index of `row`'s oldest draw not yet observed, taken off `drawn`."""
        for same in (lambda i: self.rows[i] is row, lambda i: self.rows[i] == row):
            for position, index in enumerate(self.drawn):
                if same(index):
                    return self.drawn.pop(position)
        raise ValueError("the difficulty sampler observed a row it did not hand out (or one it observed already)")

    def update(self, indices: list[int], group_rewards: torch.Tensor, solved: torch.Tensor | None = None) -> None:
        """group_rewards (len(indices),) the mean reward (pass rate) of each drawn prompt's group; solved
        (len(indices),) bool: every sample correct (for retirement). A prompt drawn twice updates twice, in order."""
        for position, index in enumerate(indices):
            self.pass_rates[index] = (1 - self.ema) * self.pass_rates[index] + self.ema * float(group_rewards[position])
            if solved is not None and self.retire_after > 0:
                self.streaks[index] = self.streaks[index] + 1 if bool(solved[position]) else 0
                self.retired[index] = bool(self.streaks[index] >= self.retire_after)

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
