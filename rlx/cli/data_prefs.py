"""`rlx data prefs`: build preference pairs by sampling a model on a verifiable task.

For each of `prompts` training prompts, sample `samples_per_prompt` completions, score them with
reward.accuracy (the task's own checker), and pair a correct completion (chosen) with an incorrect
one (rejected). Completions cut at rollout.max_new_tokens are left out (training appends the end token to
both sides of a pair). A model preset's tuning (conf/tuning/) applies as in `rlx train`: its sampling, reward
and per-task settings. Prompts where every sample is right, or every one wrong, give no pair. The output is
a jsonl file with prompt (the user message), chosen, rejected, question and answer: the `text` layout
of data.pairs, readable by `rlx train algorithm=dpo data=prefs data.pairs.path=FILE`.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig

import rlx.cli.registries  # noqa: F401  every registry publishes its names before the config is checked
from rlx.config.paths import CONF_DIR
from rlx.errors import UserError, fail
from rlx.runtime.rundir import PhaseProgress

log = logging.getLogger("rlx")


def build(cfg: DictConfig) -> dict:
    from rlx.config.schema import drop_train_tuning
    from rlx.config.settings import checked_settings
    from rlx.data.preferences import pairs_from_samples
    from rlx.data.sources import PromptStream
    from rlx.data.tasks import load_rows
    from rlx.engines.hf import generate
    from rlx.loops.common import seed_everything
    from rlx.models.loading import load_causal_lm, load_tokenizer
    from rlx.rewards import build_rewards, compute_rewards
    from rlx.rollout.prompts import format_prompts

    drop_train_tuning(cfg, "data_prefs")  # a model preset's tuning for `rlx train` alone (steps, eval)
    s = checked_settings(cfg, "data_prefs")  # every knob's type and range (rlx/config/schema.py), then typed settings
    if s.hardware.num_threads:
        torch.set_num_threads(s.hardware.num_threads)
    seed_everything(s.seed)
    train_rows, _ = load_rows(s.data, s.seed)
    rows = PromptStream(train_rows, s.seed).take(min(s.prompts, len(train_rows)))
    tokenizer = load_tokenizer(s.model.path, s.model.revision, s.model.trust_remote_code)
    model = load_causal_lm(s.model.path, s.model.dtype, s.model.revision, s.model.trust_remote_code)
    if not s.hardware.cpu and torch.cuda.is_available():
        model = model.cuda()
    rewards = build_rewards(s.reward)
    prompts = format_prompts(tokenizer, rows, s.model.chat_template, s.data.system_prompt)
    roll = s.rollout
    group = s.samples_per_prompt
    # drawn once, so sampling chunk by chunk (for the bar) draws what one call would (engines/sampling.py)
    seeds = torch.randint(0, 2**31 - 1, (len(prompts) * group,)).tolist()
    per_chunk = max(1, roll.batch_size // group)
    texts, finished = [], []
    with PhaseProgress("sampling completions", len(prompts), s.progress) as bar:
        for first in range(0, len(prompts), per_chunk):
            chunk = prompts[first:first + per_chunk]
            sampled = generate(model, tokenizer, chunk, samples_per_prompt=group, max_new_tokens=roll.max_new_tokens,
                               temperature=roll.temperature, top_p=roll.top_p, top_k=roll.top_k,
                               batch_size=roll.batch_size, seeds=seeds[first * group:(first + len(chunk)) * group])
            texts += sampled.texts
            finished += (~sampled.truncated).tolist()
            bar.advance(len(chunk))
    sample_rows = [row for row in rows for _ in range(group)]
    sample_prompts = [p for p in prompts for _ in range(group)]
    _, per_component, _ = compute_rewards(rewards, sample_prompts, texts, sample_rows, s.reward.on_error,
                                          system_prompt=s.data.system_prompt)
    scores = torch.nan_to_num(per_component[s.reward.accuracy], nan=0.0).tolist()
    pairs = pairs_from_samples(rows, texts, scores, group, s.pairs_per_prompt, s.seed, finished)
    out = Path(s.out).expanduser()
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as handle:
        for pair in pairs:
            handle.write(json.dumps(pair) + "\n")
    summary = {"prompts": len(rows), "samples": len(scores), "sample_accuracy": sum(scores) / max(1, len(scores)),
               "truncated": finished.count(False), "pairs": len(pairs)}
    log.info("done: %s  wrote %d pairs (%d prompts x %d samples, sample accuracy %.3f, %d cut at "
             "rollout.max_new_tokens left "
             "out)", out, len(pairs), len(rows), group, summary["sample_accuracy"], summary["truncated"])
    return summary


@hydra.main(config_path=str(CONF_DIR), config_name="data_prefs", version_base="1.3")
def prefs_app(cfg: DictConfig) -> None:
    try:
        build(cfg)
    except UserError as exc:
        fail(str(exc))
