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


def _calls_on_rank_one() -> int | None:
    """How many times this was called on the second process (RANK=1) from the call that should fail
    (RLX_TEST_FAIL_FROM_CALL, counted per process); None elsewhere or when the variable is unset."""
    import os

    if os.environ.get("RANK") != "1" or not os.environ.get("RLX_TEST_FAIL_FROM_CALL"):
        return None
    _CALLS[0] += 1
    return _CALLS[0] - int(os.environ["RLX_TEST_FAIL_FROM_CALL"])


_CALLS = [0]


def fail_on_rank_one(prompts, completions, **row):
    """Scores by length; raises on rank 1 from call RLX_TEST_FAIL_FROM_CALL on."""
    late = _calls_on_rank_one()
    if late is not None and late >= 0:
        raise RuntimeError("reward crashed on rank 1 only")
    return [len(c) / 10 for c in completions]


def nan_on_rank_one(prompts, completions, **row):
    """Scores by length; from call RLX_TEST_FAIL_FROM_CALL on, rank 1 returns 3e38 and 2e38 in turn: each finite
    in float32, but a group's sum overflows (inf), so its advantages, the loss and the gradient turn NaN there."""
    late = _calls_on_rank_one()
    if late is not None and late >= 0:
        return [3e38 if i % 2 == 0 else 2e38 for i in range(len(completions))]
    return [len(c) / 10 for c in completions]


def killed_on_rank_one(prompts, completions, **row):
    """Scores by length; from call RLX_TEST_FAIL_FROM_CALL on, rank 1 SIGKILLs itself (as the OOM killer would)."""
    import os
    import signal

    late = _calls_on_rank_one()
    if late is not None and late >= 0:
        os.kill(os.getpid(), signal.SIGKILL)
    return [len(c) / 10 for c in completions]
