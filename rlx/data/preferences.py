"""Preference pairs (prompt, chosen, rejected) for DPO-family training and reward models.

Sources (data.pairs.source):
  file   local .jsonl / .parquet; `builtin:NAME` names a file shipped in rlx/data/assets/NAME.jsonl
  hub    a Hugging Face dataset id (or a local dataset directory) through datasets.load_dataset

Two layouts are understood (data.pairs.layout, `auto` picks per row):
  text      prompt / chosen / rejected are strings (the prompt is the user message)
  messages  chosen / rejected are conversations (lists of {role, content}) that share the prompt
            turns, as in UltraFeedback-binarized; the last assistant turn is the completion and
            the turns before it are the prompt (the prompt column, if present, is not needed).
Each pair becomes {"prompt": rendered prompt text (chat template + generation prompt),
"chosen": text, "rejected": text, "row": its index in the source} plus "margin" when the source has one.

Malformed rows (a missing field, an empty chosen or rejected, chosen == rejected) raise a UserError
naming the row, or are skipped and counted with data.pairs.on_invalid=skip.
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass, field
from pathlib import Path

import torch

from rlx.config.paths import PACKAGE_DIR
from rlx.data.readers import read_hub as hub
from rlx.data.readers import read_records
from rlx.errors import UserError

log = logging.getLogger("rlx")

ASSETS = PACKAGE_DIR / "data" / "assets"
LAYOUTS = ("auto", "text", "messages")
TRUNCATION_MODES = ("drop", "truncate_completion", "error")
ON_INVALID = ("raise", "skip")


@dataclass
class PairStats:
    """What loading and tokenization left out, reported in the log and in metrics.jsonl."""

    loaded: int = 0
    invalid: dict = field(default_factory=dict)  # reason -> count (on_invalid=skip)
    too_long_dropped: int = 0
    completions_truncated: int = 0

    def as_metrics(self, prefix: str) -> dict:
        out = {f"{prefix}/pairs": self.loaded, f"{prefix}/too_long_dropped": self.too_long_dropped,
               f"{prefix}/completions_truncated": self.completions_truncated,
               f"{prefix}/invalid_skipped": sum(self.invalid.values())}
        return out


def resolve_pairs_path(path: str) -> Path:
    if path.startswith("builtin:"):
        name = path.split(":", 1)[1]
        local = ASSETS / f"{name}.jsonl"
        if not local.is_file():
            valid = sorted(p.stem for p in ASSETS.glob("*.jsonl"))
            raise UserError(f"no built-in preference data '{name}'; valid choices: "
                            f"{', '.join('builtin:' + v for v in valid)}")
        return local
    return Path(path).expanduser()


def read_table(path: str) -> list[dict]:
    if not path.startswith("builtin:") and not Path(path).expanduser().is_file():
        raise UserError(f"preference file '{path}' not found; set data.pairs.path to a .jsonl or .parquet file "
                        f"(or build one with `rlx data prefs out=FILE`)")
    return [row for _, row in read_records(str(resolve_pairs_path(path)), "set data.pairs.path",
                                                kind="preference file")]


def read_hub(dataset_id: str, subset, split: str) -> list[dict]:
    return list(hub(dataset_id, subset, split, "save it as jsonl and use data.pairs.source=file"))


def _is_conversation(value) -> bool:
    return isinstance(value, list) and all(isinstance(m, dict) and "role" in m and "content" in m for m in value)


def normalize_row(row: dict, index: int, source: str, columns: dict, layout: str) -> tuple[dict | None, str | None]:
    """One source row -> {"messages": prompt turns, "chosen": str, "rejected": str} or (None, reason).

    The reason is a short phrase naming what is wrong; the caller raises or counts it."""
    prompt_col, chosen_col, rejected_col = columns["prompt"], columns["chosen"], columns["rejected"]
    for col in (chosen_col, rejected_col):
        if row.get(col) is None:
            return None, f"missing field '{col}'"
    chosen, rejected = row[chosen_col], row[rejected_col]
    use_messages = layout == "messages" or (layout == "auto" and _is_conversation(chosen))
    if use_messages:
        if not (_is_conversation(chosen) and _is_conversation(rejected)):
            return None, "chosen/rejected are not both lists of {role, content} messages"
        if not chosen or chosen[-1]["role"] != "assistant" or not rejected or rejected[-1]["role"] != "assistant":
            return None, "the last message of chosen/rejected is not an assistant turn"
        messages = [dict(role=m["role"], content=m["content"]) for m in chosen[:-1]]
        if not messages:
            prompt = row.get(prompt_col)
            if not prompt:
                return None, f"missing field '{prompt_col}' (and no prompt turns before the answer)"
            messages = [{"role": "user", "content": str(prompt)}]
        chosen, rejected = chosen[-1]["content"], rejected[-1]["content"]
    else:
        prompt = row.get(prompt_col)
        if prompt is None or (isinstance(prompt, str) and not prompt.strip()):
            return None, f"missing field '{prompt_col}'"
        messages = [dict(role=m["role"], content=m["content"]) for m in prompt] if _is_conversation(prompt) else \
            [{"role": "user", "content": str(prompt)}]
    if not isinstance(chosen, str) or not isinstance(rejected, str):
        return None, "chosen/rejected are not strings (set data.pairs.layout=messages for message lists)"
    if not chosen.strip():
        return None, "empty chosen"
    if not rejected.strip():
        return None, "empty rejected"
    if chosen == rejected:
        return None, "chosen == rejected"
    out = {"messages": messages, "chosen": chosen, "rejected": rejected, "row": index}
    margin_col = columns.get("margin")
    if margin_col and row.get(margin_col) is not None:
        out["margin"] = float(row[margin_col])
    return out, None


def normalize_rows(rows: list[dict], source: str, columns: dict, layout: str, on_invalid: str,
                   stats: PairStats) -> list[dict]:
    if layout not in LAYOUTS:
        raise UserError(f"unknown data.pairs.layout '{layout}'; valid choices: {', '.join(LAYOUTS)}")
    if on_invalid not in ON_INVALID:
        raise UserError(f"unknown data.pairs.on_invalid '{on_invalid}'; valid choices: {', '.join(ON_INVALID)}")
    out = []
    for index, row in enumerate(rows):
        pair, reason = normalize_row(row, index, source, columns, layout)
        if pair is None:
            if on_invalid == "raise":
                raise UserError(f"{source} row {index}: {reason}; fix the row, map columns with data.pairs.columns.*, "
                                f"or set data.pairs.on_invalid=skip to skip and count such rows")
            stats.invalid[reason] = stats.invalid.get(reason, 0) + 1
            continue
        out.append(pair)
    stats.loaded += len(out)
    return out


def render_prompts(tokenizer, pairs: list[dict], use_chat_template: bool, system_prompt: str | None) -> None:
    """Adds pair["prompt"]: the prompt turns through the chat template, ending with the generation prompt."""
    has_template = use_chat_template and getattr(tokenizer, "chat_template", None)
    for pair in pairs:
        messages = pair["messages"]
        if system_prompt and messages[0]["role"] != "system":
            messages = [{"role": "system", "content": system_prompt}] + messages
        if has_template:
            pair["prompt"] = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        else:
            pair["prompt"] = "\n\n".join(m["content"] for m in messages)


def _file_pairs(pairs_cfg, columns: dict, stats: PairStats) -> tuple[list[dict], list[dict] | None]:
    train = normalize_rows(read_table(pairs_cfg.path), pairs_cfg.path, columns, pairs_cfg.layout, pairs_cfg.on_invalid,
                           stats)
    evals = None
    if pairs_cfg.eval_path:
        evals = normalize_rows(read_table(pairs_cfg.eval_path), pairs_cfg.eval_path, columns, pairs_cfg.layout,
                               pairs_cfg.on_invalid, stats)
    return train, evals


def _hub_pairs(pairs_cfg, columns: dict, stats: PairStats) -> tuple[list[dict], list[dict] | None]:
    train = normalize_rows(read_hub(pairs_cfg.id, pairs_cfg.subset, pairs_cfg.train_split), pairs_cfg.id, columns,
                           pairs_cfg.layout, pairs_cfg.on_invalid, stats)
    evals = None
    if pairs_cfg.eval_split:
        evals = normalize_rows(read_hub(pairs_cfg.id, pairs_cfg.subset, pairs_cfg.eval_split), pairs_cfg.id, columns,
                               pairs_cfg.layout, pairs_cfg.on_invalid, stats)
    return train, evals


# data.pairs.source: fn(pairs_cfg, columns, stats) -> (train pairs, held-out pairs or None: split off train)
PAIR_SOURCES = {"file": _file_pairs, "hub": _hub_pairs}


def load_pairs(pairs_cfg, seed: int) -> tuple[list[dict], list[dict], PairStats]:
    """(train pairs, held-out pairs, stats) with messages/chosen/rejected; prompts are rendered later."""
    stats = PairStats()
    if pairs_cfg.source not in PAIR_SOURCES:
        raise UserError(f"unknown data.pairs.source '{pairs_cfg.source}'; valid choices: {', '.join(PAIR_SOURCES)}")
    train, evals = PAIR_SOURCES[pairs_cfg.source](pairs_cfg, dict(pairs_cfg.columns), stats)
    if stats.invalid:
        log.warning("skipped %d malformed preference rows: %s", sum(stats.invalid.values()),
                    ", ".join(f"{k} x{v}" for k, v in stats.invalid.items()))
    if evals is None:  # split held-out pairs off by prompt, so no prompt is in both
        prompts = sorted({json.dumps(p["messages"]) for p in train})
        random.Random(seed).shuffle(prompts)
        held = set(prompts[: pairs_cfg.eval_size])
        evals = [p for p in train if json.dumps(p["messages"]) in held]
        train = [p for p in train if json.dumps(p["messages"]) not in held]
    evals = evals[: pairs_cfg.eval_size]
    if not train:
        raise UserError("no training pairs left after removing malformed rows and held-out prompts")
    return train, evals, stats


@dataclass
class PairBatch:
    """Tokenized pairs: prompt ids left-padded, chosen and rejected completions right-padded (with EOS)."""

    prompt_ids: torch.Tensor       # (B, P)
    prompt_mask: torch.Tensor      # (B, P)
    chosen_ids: torch.Tensor       # (B, C)
    chosen_mask: torch.Tensor      # (B, C)
    rejected_ids: torch.Tensor     # (B, R)
    rejected_mask: torch.Tensor    # (B, R)
    margin: torch.Tensor | None    # (B,) per-pair margin for reward models, when the data has one


def tokenize_pairs(tokenizer, pairs: list[dict], max_prompt_length: int, max_completion_length: int, mode: str,
                   stats: PairStats) -> list[dict]:
    """Adds token ids to each pair; applies the truncation mode. Returns the pairs that are kept.

    A prompt longer than max_prompt_length is never cut (that would drop the question or the chat
    template's start): the pair is dropped and counted (mode drop / truncate_completion) or it is an
    error (mode error). A completion longer than max_completion_length drops the pair (drop), is cut
    to the limit without its EOS (truncate_completion), or is an error."""
    if mode not in TRUNCATION_MODES:
        raise UserError(f"unknown data.pairs.truncation '{mode}'; valid choices: {', '.join(TRUNCATION_MODES)}")
    eos = tokenizer.eos_token or ""
    kept = []
    for pair in pairs:
        prompt = tokenizer(pair["prompt"], add_special_tokens=False)["input_ids"]
        chosen = tokenizer(pair["chosen"] + eos, add_special_tokens=False)["input_ids"]
        rejected = tokenizer(pair["rejected"] + eos, add_special_tokens=False)["input_ids"]
        too_long_prompt = len(prompt) > max_prompt_length
        too_long_completion = max(len(chosen), len(rejected)) > max_completion_length
        if mode == "error" and (too_long_prompt or too_long_completion):
            what = "prompt" if too_long_prompt else "completion"
            raise UserError(f"preference row {pair['row']}: {what} longer than data.pairs.max_{what}_length; raise it "
                            "or set data.pairs.truncation=drop|truncate_completion")
        if too_long_prompt or (too_long_completion and mode == "drop"):
            stats.too_long_dropped += 1
            continue
        if too_long_completion:
            stats.completions_truncated += 1
            chosen, rejected = chosen[:max_completion_length], rejected[:max_completion_length]
        kept.append(dict(pair, prompt_tokens=prompt, chosen_tokens=chosen, rejected_tokens=rejected))
    if stats.too_long_dropped or stats.completions_truncated:
        log.warning("preference pairs over the length limits: %d dropped, %d with truncated completions",
                    stats.too_long_dropped, stats.completions_truncated)
    return kept


def _pad(sequences: list[list[int]], pad_id: int, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)  # (B, T)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)  # (B, T)
    for i, seq in enumerate(sequences):
        if seq:
            span = slice(width - len(seq), width) if left else slice(0, len(seq))
            ids[i, span] = torch.tensor(seq)
            mask[i, span] = 1
    return ids, mask


def collate(pairs: list[dict], pad_id: int) -> PairBatch:
    prompt_ids, prompt_mask = _pad([p["prompt_tokens"] for p in pairs], pad_id, left=True)
    chosen_ids, chosen_mask = _pad([p["chosen_tokens"] for p in pairs], pad_id, left=False)
    rejected_ids, rejected_mask = _pad([p["rejected_tokens"] for p in pairs], pad_id, left=False)
    margin = torch.tensor([p.get("margin", 0.0) for p in pairs]) if any("margin" in p for p in pairs) else None
    return PairBatch(prompt_ids, prompt_mask, chosen_ids, chosen_mask, rejected_ids, rejected_mask, margin)


def prepare_pairs(pairs_cfg, tokenizer, pairs: list[dict], use_chat_template: bool, system_prompt: str | None,
                  stats: PairStats) -> list[dict]:
    """Render prompts and tokenize with the configured limits and truncation mode."""
    render_prompts(tokenizer, pairs, use_chat_template, system_prompt)
    return tokenize_pairs(tokenizer, pairs, pairs_cfg.max_prompt_length, pairs_cfg.max_completion_length,
                          pairs_cfg.truncation, stats)


def pairs_from_samples(rows: list[dict], completions: list[str], scores: list[float], group_size: int,
                       pairs_per_prompt: int, seed: int, finished: list[bool] | None = None) -> list[dict]:
    """Pair correct (score 1) with incorrect (score 0) samples of the same prompt.

    rows: one per prompt; completions/scores: group_size per prompt, adjacent. A prompt whose
    samples are all correct or all incorrect gives no pair; otherwise up to pairs_per_prompt pairs,
    each a distinct (correct, incorrect) text combination drawn at random. finished: whether each sample
    ended with its stop token; the others (cut at the token budget) are left out, since training reads a
    pair's completions as whole answers and appends the end token to each."""
    rng = random.Random(seed)
    out = []
    for i, row in enumerate(rows):
        group = [j for j in range(i * group_size, (i + 1) * group_size) if finished is None or finished[j]]
        correct = sorted({completions[j] for j in group if scores[j] >= 1.0})
        wrong = sorted({completions[j] for j in group if scores[j] <= 0.0} - set(correct))
        combos = [(c, w) for c in correct for w in wrong if c.strip() and w.strip()]
        rng.shuffle(combos)
        for chosen, rejected in combos[:pairs_per_prompt]:
            out.append({"prompt": row["prompt"], "chosen": chosen, "rejected": rejected,
                        "question": row.get("question"), "answer": row.get("answer")})
    return out


def load_prepared_pairs(cfg, tokenizer) -> tuple[list[dict], list[dict], dict]:
    """Train and held-out pairs, tokenized, and data/* counts for metrics.jsonl."""
    train, evals, stats = load_pairs(cfg.data.pairs, cfg.seed)
    train = prepare_pairs(cfg.data.pairs, tokenizer, train, cfg.model.chat_template, cfg.data.system_prompt, stats)
    evals = prepare_pairs(cfg.data.pairs, tokenizer, evals, cfg.model.chat_template, cfg.data.system_prompt, stats)
    if not train:
        from rlx.errors import UserError

        raise UserError("every training pair is over data.pairs.max_prompt_length / max_completion_length; raise them")
    logging.getLogger("rlx").info(
        "preference pairs: %d train, %d held out (%d malformed skipped, %d too long dropped, %d truncated)",
        len(train), len(evals), sum(stats.invalid.values()), stats.too_long_dropped, stats.completions_truncated)
    return train, evals, stats.as_metrics("data")
