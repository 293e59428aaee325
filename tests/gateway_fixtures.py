"""Shared pieces of the gateway tests (tests/test_gateway_*.py): the tiny agent's tokenizer, a scripted
generator that needs no model, and a Hermes-style chat template (as Qwen 2.5 renders tools)."""

from __future__ import annotations

import functools
import threading

from rlx.engines.records import Generation


@functools.cache
def tiny_tokenizer():
    from rlx.models.loading import load_tokenizer

    return load_tokenizer("builtin:tiny_agent")


def encode(text: str) -> list[int]:
    return tiny_tokenizer()(text, add_special_tokens=False)["input_ids"]


class ScriptedGenerator:
    """Generator protocol without a model: each row's ids are `reply(context, seed)` (a string, encoded and
    closed with the stop token, or a list of ids taken as sampled), log-prob -0.5 per token. Records every
    call (contexts, seeds, budgets) so tests can read what the gateway asked for."""

    version = 0

    def __init__(self, reply, temperature: float = 1.0, fail: bool = False):
        self.reply, self.fail = reply, fail
        tiny_tokenizer()  # loaded here, not inside the first timed batch
        self.temperature, self.top_p, self.top_k = temperature, 1.0, 0
        self.calls: list[dict] = []
        self.threads: set[str] = set()

    def generate_ids(self, prompts, *, max_new_tokens, seeds, greedy=False, samples_per_prompt=1, min_new_tokens=0):
        self.threads.add(threading.current_thread().name)
        self.calls.append({"prompts": [list(p) for p in prompts], "seeds": list(seeds),
                           "max_new_tokens": max_new_tokens, "greedy": greedy})
        if self.fail:
            raise RuntimeError("the model broke")
        ids, stopped = [], []
        for context, seed in zip(prompts, seeds):
            out = self.reply(list(context), seed)
            row = encode(out) + [tiny_tokenizer().eos_token_id] if isinstance(out, str) else list(out)
            ids.append(row[:max_new_tokens])
            stopped.append(len(row) <= max_new_tokens and bool(row) and row[-1] == tiny_tokenizer().eos_token_id)
        return Generation(ids, [[-0.5] * len(r) for r in ids], stopped)


# Hermes / Qwen 2.5 style: tools listed in the system turn, assistant tool calls as <tool_call>{json}</tool_call>,
# tool results inside a user turn as <tool_response>...</tool_response> (a shortened Qwen 2.5 template)
HERMES_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\nTools:' }}{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- "
    "endfor %}{{- '<|im_end|>\\n' }}{%- endif %}{%- for m in messages %}{%- if m.role == 'assistant' %}{{- "
    "'<|im_start|>assistant' }}{%- if m.content %}{{- '\\n' + m.content }}{%- endif %}{%- for c in m.tool_calls or [] "
    "%}{{- '\\n<tool_call>\\n{\"name\": \"' + c.function.name + '\", \"arguments\": ' + (c.function.arguments | "
    "tojson) + '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}{%- elif m.role == 'tool' %}{{- "
    "'<|im_start|>user\\n<tool_response>\\n' + m.content + '\\n</tool_response><|im_end|>\\n' }}{%- else %}{{- "
    "'<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}{%- if "
    "add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

CALCULATOR = {"type": "function", "function": {"name": "calc", "description": "integer arithmetic",
                                               "parameters": {"type": "object",
                                                              "properties": {"expression": {"type": "string"}},
                                                              "required": ["expression"]}}}
