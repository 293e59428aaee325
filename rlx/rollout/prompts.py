"""Prompt rendering: a data row's prompt (text or chat messages) -> the model's input text."""

from __future__ import annotations

from rlx.rewards import with_system_prompt


def format_prompts(tokenizer, rows: list[dict], use_chat_template: bool, system_prompt: str | None) -> list[str]:
    """User messages (a string, or a chat message list for conversational data) -> model input text
    (chat template with the generation prompt when available; the system prompt goes first unless the
    message list has its own)."""
    if use_chat_template and getattr(tokenizer, "chat_template", None):
        out = []
        for row in rows:
            prompt = row["prompt"]
            messages = with_system_prompt(prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}],
                                          system_prompt)
            out.append(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
        return out
    out = []
    for row in rows:  # no chat template: messages are joined as plain text
        messages = row["prompt"] if isinstance(row["prompt"], list) else [{"role": "user", "content": row["prompt"]}]
        out.append("\n\n".join(m["content"] for m in with_system_prompt(messages, system_prompt)))
    return out
