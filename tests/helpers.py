"""Reward functions used by the tests (importable as tests.helpers from the repo root)."""


def broken_reward(prompts, completions, **row):
    raise RuntimeError("checker crashed")


def crash_when_both(prompts, completions, first=False, second=False, **row):
    """Scores 0, but raises when both flags are set: lets a 2x2 sweep have exactly one crashing trial."""
    if first and second:
        raise RuntimeError("forced crash for the sweep failure test")
    return [0.0] * len(completions)


def solution_is_a_number(completions, solution, **kwargs):
    """TRL-style: reads the dataset's `solution` column by its own name; 1.0 when it holds an integer."""
    return [1.0 if str(s).lstrip("-").isdigit() else 0.0 for s in solution]


def length_reward(prompts, completions, **row):
    """Characters / 10: sampled completions of one prompt differ in length, so every group has a learning signal."""
    return [len(c) / 10 for c in completions]


def alternating_reward(prompts, completions, **row):
    """1.0 for every other completion of the batch: samples of one prompt sit next to each other, so every group
    of two or more has tied-free rewards whatever the CPU samples (a learning signal by construction)."""
    return [float(i % 2 == 0) for i in range(len(completions))]


class SeedParity:
    """A text environment whose outcome is fixed by its seed, whatever the model says: the first step
    ends the episode, successful (reward 1) when the reset seed is even."""

    def reset(self, *, seed=None, options=None):
        self.win = (seed or 0) % 2 == 0
        return "say anything", {}

    def step(self, action):
        return "done", float(self.win), True, False, {"metrics": {"success": float(self.win)}}
