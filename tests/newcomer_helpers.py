"""Environments and reward functions a new user would write, for tests/test_first_hour_*.py (importable as
tests.newcomer_helpers from the repository root, which the tests put on PYTHONPATH)."""


class Countdown:
    """Say anything `turns` times; the episode then ends successfully (reward 1). The observation is
    `words` repetitions of "tick", so its token length is set by the test (the first-observation and
    budget checks)."""

    def __init__(self, turns: int = 2, words: int = 4):
        self.turns, self.words = int(turns), int(words)

    def reset(self, *, seed=None, options=None):
        self.left = self.turns
        return " ".join(["tick"] * self.words), {}

    def step(self, action):
        self.left -= 1
        done = self.left <= 0
        return " ".join(["tick"] * self.words), float(done), done, False, {"metrics": {"success": float(done)}}


def prompt_spy(prompts, completions, **columns):
    """Scores 0; records what a reward function receives (prompts and column names) in SEEN."""
    SEEN.append({"prompts": list(prompts), "columns": sorted(columns)})
    return [0.0] * len(completions)


SEEN: list[dict] = []


def mentions_prompt(prompts, completions, **kwargs):
    """1.0 when the completion is non-empty; reads `prompts` as TRL gives them (the dataset's prompt column)."""
    assert all(isinstance(p, str) for p in prompts)
    return [float(bool(c.strip())) for c in completions]
