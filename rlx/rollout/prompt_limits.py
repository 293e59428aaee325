"""RL prompts against the model's context: dropped or truncated to data.max_prompt_length, and a check that a
prompt plus the completion budget fits the model's position embeddings."""

from __future__ import annotations

from rlx.errors import UserError
from rlx.rollout.prompts import format_prompts


def limit_prompt_length(tokenizer, rows: list[dict], max_tokens: int | None, mode: str, use_chat_template: bool,
                        system_prompt: str | None) -> tuple[list[dict], dict]:
    """Keep RL prompts within max_tokens tokens of model input (TRL/verl's max_prompt_length).
    mode "drop" leaves longer prompts out; "truncate" cuts the start of the (last) user message, keeping
    its end, until the rendered prompt fits. Returns the rows and counts {prompts, over_length, dropped, truncated}."""
    counts = {"prompts": len(rows), "over_length": 0, "dropped": 0, "truncated": 0}
    if max_tokens is None:
        return rows, counts
    if mode not in ("drop", "truncate"):
        raise UserError(f"data.overlong_prompts={mode!r}; valid choices: drop, truncate")

    def length(row):
        return len(tokenizer(format_prompts(tokenizer, [row], use_chat_template, system_prompt)[0],
                             add_special_tokens=False)["input_ids"])

    kept = []
    for row in rows:
        over = length(row) - max_tokens
        if over <= 0:
            kept.append(row)
            continue
        counts["over_length"] += 1
        if mode == "drop":
            counts["dropped"] += 1
            continue
        row = dict(row)
        for _ in range(4):  # re-tokenising the cut text can differ by a token or two
            messages = row["prompt"] if isinstance(row["prompt"], list) else None
            text = messages[-1]["content"] if messages else row["prompt"]
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            text = tokenizer.decode(ids[min(len(ids), over):])
            row["prompt"] = messages[:-1] + [dict(messages[-1], content=text)] if messages else text
            over = length(row) - max_tokens
            if over <= 0:
                break
        if over > 0:  # the template alone is longer than the budget
            counts["dropped"] += 1
            continue
        counts["truncated"] += 1
        kept.append(row)
    if not kept:
        raise UserError(f"data.max_prompt_length={max_tokens} leaves no training prompt; raise it")
    return kept, counts


def model_context(model) -> int | None:
    """The longest sequence the model's position embeddings cover (None when its config does not say)."""
    config = getattr(model, "config", None)
    value = getattr(config, "max_position_embeddings", None)
    return int(value) if isinstance(value, int) and value > 0 else None


def check_context(tokenizer, rows: list[dict], context: int | None, max_new_tokens: int, use_chat_template: bool,
                  system_prompt: str | None, source: str) -> None:
    """Stop before training when a prompt plus the completion budget is longer than the model's context.

    Positions past max_position_embeddings either crash inside the model or (rotary models) silently
    extrapolate, so one line names the first such row, its length and the knobs that fix it."""
    if context is None or not rows:
        return
    if max_new_tokens >= context:
        raise UserError(f"rollout.max_new_tokens={max_new_tokens} leaves no room for a prompt in the model's context "
                        f"({context} tokens, max_position_embeddings); lower it")
    texts = format_prompts(tokenizer, rows, use_chat_template, system_prompt)
    lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    budget = context - max_new_tokens
    for index, length in enumerate(lengths):
        if length > budget:
            over = sum(n > budget for n in lengths)
            raise UserError(f"{source} row {index}: the prompt is {length} tokens, and with rollout.max_new_tokens="
                            f"{max_new_tokens} it exceeds the model's context ({context} tokens; {over} of {len(rows)} "
                            f"prompts do); set data.max_prompt_length={budget} (drops or truncates them) or lower "
                            f"rollout.max_new_tokens")
