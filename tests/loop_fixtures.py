"""A tiny fixed world in which the REAL training loops run in-process, for tests/test_direction.py and
tests/test_golden_losses.py.

- the shipped tiny model (rlx/models/assets/tiny) and its tokenizer;
- a config with evaluation, sampling files, plots and the final save turned off;
- `FixedSampler`: stands in for the policy's generator (HFGenerator) and returns fixed completions (so the
  learning signal is built by construction and does not depend on which tokens a CPU samples);
- `plain_logprobs`, `plain_score`: what a model gives a sequence, computed independently of rlx (one
  unpadded forward pass per sequence, no rlx batching, padding or masking), to judge the loops by.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rlx.config.overrides import check_overrides
from rlx.config.settings import settings as typed_settings
from rlx.engines.records import Generation
from rlx.loops.common import Components
from rlx.rewards import RewardComponent

# evaluation, sample files, plots and the final save off; the learning rate constant from the first step
QUIET = ["eval.every=0", "eval.at_start=false", "log.samples_every=0", "log.progress=false", "save.final=false",
         "save.plot=false", "optim.warmup_steps=0", "optim.schedule=constant", "checkpoint.every=0"]

# fixed completions of different token lengths (so every batch has padding): one the tiny model finds
# likely (summed log-prob about -10), one it finds very unlikely (about -150), and a third, shorter one
LIKELY = "<answer>7</answer>"
UNLIKELY = "I do not know"
MID = "<answer>5"

PROMPTS = ["What is 3 + 4?", "What is 2 + 5?", "Add 1, 2 and 4."]


@pytest.fixture
def one_thread():
    """One torch thread while a test runs (the loops are tiny; on a shared machine more threads only wait)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def loop_config(*overrides: str):
    return check_overrides([*QUIET, *overrides])


def run_loop(loop, cfg, parts: Components) -> dict:
    """Build every part from the config (rlx.build.build_parts) and run `loop` on them, as `rlx train` does."""
    from rlx.build import build_parts

    built = build_parts(typed_settings(cfg), parts)
    return loop(built.settings, built)


def tiny_policy():
    from rlx.models.loading import load_causal_lm, load_tokenizer

    return load_causal_lm("builtin:tiny"), load_tokenizer("builtin:tiny")


def tiny_scorer(tokenizer, seed: int = 0):
    """The tiny backbone with a fresh scalar head (as train.py builds a reward model), seeded."""
    from rlx.rewards.model import load_sequence_classifier

    torch.manual_seed(seed)
    return load_sequence_classifier("builtin:tiny", pad_token_id=tokenizer.pad_token_id)


def components(tmp_path: Path, model, tokenizer, rows: list[dict] | None = None, reward_fn=None) -> Components:
    from accelerate import Accelerator

    rewards = [RewardComponent("task", reward_fn, 1.0)] if reward_fn is not None else []
    return Components(Accelerator(cpu=True), model, tokenizer, rows or [], [], rewards, tmp_path)


def rows(prompts=PROMPTS, answer="7") -> list[dict]:
    return [{"prompt": p, "answer": answer} for p in prompts]


def scored_by(table: dict[str, float]):
    """A reward function giving each fixed completion text its score from `table`."""

    def reward(prompts, completions, **row):
        return [table[c] for c in completions]

    return reward


def render(tokenizer, prompt: str) -> list[int]:
    """Prompt token ids as every loop renders a user message: chat template with the generation prompt."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def completion_tokens(tokenizer, text: str) -> list[int]:
    return tokenizer(text + tokenizer.eos_token, add_special_tokens=False)["input_ids"]


class FixedSampler:
    """A generator (rlx.engines.generator protocol) of fixed completions, put in place of the one the builder
    builds (`monkeypatch.setattr(rlx.build, "build_generator", sampler)`: building one returns this sampler, the
    policy it was built on in `self.model`): sample j of each prompt is completions[j % len(completions)]
    followed by EOS. Records every sample it handed out."""

    version = 0

    def __init__(self, tokenizer, completions: list[str]):
        self.tokenizer, self.completions = tokenizer, completions
        self.samples: list[tuple[list[int], list[int], str]] = []  # (prompt ids, completion ids, text)

    def __call__(self, rollout, model, tokenizer, seed, **__):
        self.model = model
        return self

    def publish(self, model, version: int) -> None:
        self.version = version

    def sleep(self) -> None:
        pass

    def step_metrics(self) -> dict:
        return {}

    def close(self) -> None:
        pass

    def generate_ids(self, prompts: list[list[int]], *, samples_per_prompt: int = 1, **_) -> Generation:
        batch = []
        for ids in prompts:
            for j in range(samples_per_prompt):
                text = self.completions[j % len(self.completions)]
                batch.append((list(ids), completion_tokens(self.tokenizer, text), text))
        self.samples += batch
        return Generation([b[1] for b in batch], None, [True] * len(batch))


@torch.no_grad()
def plain_logprobs(model, prompt_ids: list[int], completion_ids: list[int]) -> torch.Tensor:
    """log pi(c_t | prompt, c_<t) of each completion token, (len(c),) float64, from one unpadded forward pass."""
    ids = torch.tensor([prompt_ids + completion_ids])
    logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].double()  # (C, V)
    return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(completion_ids)[:, None]).squeeze(1)


@torch.no_grad()
def plain_entropy(model, prompt_ids: list[int], completion_ids: list[int]) -> torch.Tensor:
    """H_t = -sum_v p log p of the next-token distribution at each completion position, (len(c),)."""
    ids = torch.tensor([prompt_ids + completion_ids])
    logp = torch.log_softmax(model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].double(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


@torch.no_grad()
def plain_score(model, token_ids: list[int]) -> float:
    """Scalar score of one unpadded sequence by a sequence-classification model (its last token)."""
    return model(input_ids=torch.tensor([token_ids])).logits[0, 0].item()


def write_pairs(path: Path, pairs: list[tuple[str, str, str]], margins: list[float] | None = None) -> Path:
    """A jsonl file of (prompt, chosen, rejected) rows (and a margin column when given)."""
    with path.open("w") as f:
        for i, (prompt, chosen, rejected) in enumerate(pairs):
            row = {"prompt": prompt, "chosen": chosen, "rejected": rejected}
            if margins is not None:
                row["margin"] = margins[i]
            f.write(json.dumps(row) + "\n")
    return path


def pair_config(path: Path, algorithm: str, *overrides: str):
    """Config of a preference or reward-model run on the pairs in `path`, with no held-out pairs."""
    return loop_config(f"algorithm={algorithm}", "data=prefs", f"data.pairs.path={path}", "data.pairs.eval_size=0",
                       *overrides)


def perturbed_copy(model, scale: float = 0.05, seed: int = 1):
    """A frozen copy of `model` with every weight moved by scale * N(0, 1): a reference that differs
    from the policy, so that KL terms and log-ratios are not all zero."""
    import copy

    generator = torch.Generator().manual_seed(seed)
    other = copy.deepcopy(model)
    with torch.no_grad():
        for param in other.parameters():
            param.add_(scale * torch.randn(param.shape, generator=generator))
    return other.eval().requires_grad_(False)


def offsets(shape: tuple[int, int], scale: float = 0.4) -> torch.Tensor:
    """A fixed, smooth table of offsets in [-scale, scale], (N, T), nonzero at padded positions too."""
    n, t = shape
    grid = torch.arange(n, dtype=torch.float64)[:, None] * 1.7 + torch.arange(t, dtype=torch.float64)[None, :] * 0.9
    return scale * torch.sin(grid)
