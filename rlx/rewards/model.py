"""Learned rewards: sequence-classification reward models, alone or as an ensemble.

`model_reward` follows the reward contract fn(prompts, completions, **row) -> list[float]: it scores
prompt + completion (+ EOS, as in reward-model training) with one or more checkpoints, each a hub id,
a local save_pretrained folder, or an rlx run directory (its final/ model is used). It scores the policy's
rendered prompts (`prompt_texts`: chat template applied), so the reward model must share the policy's chat
format, as a reward model trained from the policy's own checkpoint does.

Ensembles (Coste et al. 2023, "Reward Model Ensembles Help Mitigate Overoptimization") aggregate the
members' scores per completion: mean, worst-case (min), or uncertainty-weighted (mean - coef * var).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from rlx.errors import UserError
from rlx.rewards import completion_text

AGGREGATIONS = ("mean", "min", "uncertainty")


def aggregate_ensemble(scores: torch.Tensor, mode: str, uncertainty_coef: float = 1.0) -> torch.Tensor:
    """Combine K reward models' scores, (K, N) -> (N,).  Coste et al. 2023, section 4.

      mean:         R = (1/K) sum_k r_k                      (mean optimization)
      min:          R = min_k r_k                            (worst-case optimization, WCO)
      uncertainty:  R = mean_k r_k - coef * Var_k r_k        (uncertainty-weighted optimization, UWO;
                                                              population variance over the K members)
    With K = 1 every mode returns the single model's scores (the variance is 0).
    """
    if mode == "mean":
        return scores.mean(dim=0)
    if mode == "min":
        return scores.min(dim=0).values
    if mode == "uncertainty":
        return scores.mean(dim=0) - uncertainty_coef * scores.var(dim=0, unbiased=False)
    raise UserError(f"unknown reward model aggregation '{mode}'; valid choices: {', '.join(AGGREGATIONS)}")


def resolve_checkpoint(path: str) -> str:
    """An rlx run directory -> its final/ model; builtin:NAME -> the shipped asset; otherwise unchanged."""
    from rlx.models.loading import resolve_model_path

    local = Path(path).expanduser()
    if (local / "final" / "config.json").is_file():
        return str(local / "final")
    return resolve_model_path(path)


def load_sequence_classifier(path: str, dtype: str = "float32", num_labels: int = 1, pad_token_id: int | None = None):
    """AutoModelForSequenceClassification with a scalar head (a fresh head when the checkpoint is a causal LM)."""
    from transformers import AutoModelForSequenceClassification

    from rlx.models.loading import DTYPES

    resolved = resolve_checkpoint(path)
    try:
        model = AutoModelForSequenceClassification.from_pretrained(resolved, num_labels=num_labels, dtype=DTYPES[dtype])
    except OSError as exc:
        raise UserError(f"cannot load reward model '{path}' ({type(exc).__name__}): point it at a save_pretrained "
                        f"folder, an rlx reward-model run directory, or a downloaded hub id") from None
    if pad_token_id is not None:
        model.config.pad_token_id = pad_token_id  # the head pools the last non-pad token
    return model


@functools.lru_cache(maxsize=8)
def _load(path: str, dtype: str, device: str):
    from rlx.models.loading import load_tokenizer

    tokenizer = load_tokenizer(resolve_checkpoint(path))
    model = load_sequence_classifier(path, dtype, pad_token_id=tokenizer.pad_token_id).to(device).eval()
    return model, tokenizer


@torch.no_grad()
def sequence_scores(model, tokenizer, prompts: list[str], completions: list[str], batch_size: int) -> torch.Tensor:
    """Scalar score of each prompt + completion + EOS, (N,). Prompt and completion are tokenized
    separately (as in reward-model training) and right-padded together."""
    device = next(model.parameters()).device
    eos = tokenizer.eos_token or ""
    sequences = [tokenizer(p, add_special_tokens=False)["input_ids"]
                 + tokenizer(c + eos, add_special_tokens=False)["input_ids"]
                 for p, c in zip(prompts, completions)]
    return score_token_sequences(model, sequences, tokenizer.pad_token_id, batch_size, device)


def score_token_sequences(model, sequences: list[list[int]], pad_id: int, batch_size: int, device) -> torch.Tensor:
    """Scores (N,) of token-id sequences, batched; right padding, position ids from the mask."""
    out = []
    for lo in range(0, len(sequences), batch_size):
        chunk = sequences[lo : lo + batch_size]
        width = max(len(s) for s in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)  # (b, T)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)  # (b, T)
        for i, seq in enumerate(chunk):
            ids[i, : len(seq)] = torch.tensor(seq)
            mask[i, : len(seq)] = 1
        out.append(forward_scores(model, ids.to(device), mask.to(device)).float().cpu())
    return torch.cat(out) if out else torch.zeros(0)


def forward_scores(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Score at the last attended token of each sequence, (b,); works for left or right padding.
    Decoder models with a `score` head are pooled here (robust when pad == EOS); others use their own pooling."""
    if not hasattr(model, "score"):
        return model(input_ids=input_ids, attention_mask=attention_mask).logits[:, 0]
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)  # (b, T)
    hidden = model.base_model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                              use_cache=False).last_hidden_state  # (b, T, H)
    last = attention_mask.shape[1] - 1 - attention_mask.flip(dims=[1]).argmax(dim=1)  # (b,) index of last 1
    pooled = hidden[torch.arange(hidden.shape[0], device=hidden.device), last]  # (b, H)
    return model.score(pooled).squeeze(-1)  # (b,)


@dataclass(frozen=True)
class RewardModelSettings:
    """The keys of a model reward component (reward.components.model; conf/reward/model.yaml holds the run's
    values, these defaults are only for direct calls): path (one checkpoint, or a list: an ensemble), aggregate
    (AGGREGATIONS), uncertainty_coef, batch_size (sequences per forward pass), dtype, cpu."""

    path: str | list | None = None
    aggregate: str = "mean"
    uncertainty_coef: float = 1.0
    batch_size: int = 64
    dtype: str = "float32"
    cpu: bool = True

    @classmethod
    def from_config(cls, keys: dict) -> RewardModelSettings:
        """The settings among a call's keywords (the component's config keys; the rest are dataset columns)."""
        return cls(**{f.name: keys[f.name] for f in fields(cls) if f.name in keys})


def model_reward(prompts, completions, *, prompt_texts=None, **config_and_row) -> list[float]:
    """Reward-model score of each completion. config_and_row: the component's config keys (RewardModelSettings:
    `path` is one checkpoint or a list, an ensemble) and the dataset's columns (unused). prompt_texts: the
    policy's model inputs (rlx.rewards.compute_rewards passes them); without them, `prompts`."""
    return reward_model_scores(prompts, completions, RewardModelSettings.from_config(config_and_row), prompt_texts)


def reward_model_scores(prompts, completions, settings: RewardModelSettings, prompt_texts=None) -> list[float]:
    """model_reward with its settings built: each member of settings.path scores every completion, the members'
    scores aggregated per completion (aggregate_ensemble)."""
    if prompt_texts is not None and not any(isinstance(q, list) for q in prompts):
        prompts = prompt_texts  # string prompts: score what the policy saw (a conversational list is rendered below)
    path = settings.path
    paths = [path] if isinstance(path, str) else list(path or [])
    if not paths:
        raise UserError("reward=model needs reward.components.model.path (a checkpoint, an rlx run directory, or a "
                        "list)")
    device = "cpu" if settings.cpu or not torch.cuda.is_available() else "cuda"
    members = []
    for p in paths:
        model, tokenizer = _load(str(p), settings.dtype, device)
        texts = [tokenizer.apply_chat_template(q, tokenize=False, add_generation_prompt=True) if isinstance(q, list)
                 else q
                 for q in prompts]  # a conversational dataset's message lists, rendered by the reward model's template
        members.append(sequence_scores(model, tokenizer, texts, [completion_text(c) for c in completions],
                                       settings.batch_size))
    # (K, N) -> (N,)
    return aggregate_ensemble(torch.stack(members), settings.aggregate, settings.uncertainty_coef).tolist()
