"""Reward functions used by the tests (importable as tests.helpers from the repo root)."""


def broken_reward(prompts, completions, **row):
    raise RuntimeError("checker crashed")
