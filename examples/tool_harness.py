"""Arithmetic with a calculator tool, declared as an OpenAI tool schema and called through `tool_calls`.

The question is the tool task's (rlx/envs/tools.py: a*b+c from the episode's seed); the harness runs the
calculator itself and sends its result back as a `role: tool` message, and pays 1 for a right
<answer>N</answer>. Train it (from the repository root; the budget of recipe agent_grpo_tool_tiny):

    PYTHONPATH=. rlx train agent_grpo_tool_tiny env=harness env.target=examples.tool_harness.run \
        env.tool_parser=tags env.chat_template=examples/tiny_tools.jinja \
        env.max_turns=3 env.max_new_tokens=24 hardware.num_threads=1

The built-in tiny agent cannot write Hermes <tool_call>{json}</tool_call> blocks: its warm start
(recipe tiny_agent_sft) taught it <calc>37*12+5</calc>. So the gateway reads that format as a tool call
(tool_parser=tags: <NAME>argument</NAME> for a declared one-parameter tool), and examples/tiny_tools.jinja
renders assistant tool calls and tool results back in it, exactly as env=tool_use shows them. A model whose
chat template knows tools (Qwen 2.5 / 3, Hermes) needs neither: tool_parser=hermes and its own template.
"""

from __future__ import annotations

import json
import re

import openai
from openai import OpenAI

from rlx.envs.tools import ToolUse, calculate

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Evaluate integer arithmetic: + - * // % and parentheses.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}
NUDGE = "error: call a tool (<calc>...</calc>) or reply <answer>...</answer>"  # what env=tool_use answers, too


def calculator(arguments: str) -> tuple[str, bool]:
    """(the tool message's content, whether the call was valid)."""
    try:
        return f"<result>{calculate(json.loads(arguments)['expression'])}</result>", True
    except (ValueError, KeyError, TypeError) as exc:  # bad JSON, no expression, or an expression it refuses
        return f"error: {exc}", False


# one HTTP connection pool for every episode of this process: a client of its own per episode would build
# an SSL context each time (~35 ms of CPU), more than the tiny model takes to answer
HTTP = openai.DefaultHttpxClient()


def run(task, base_url, api_key, max_calls: int = 3):
    question_source = ToolUse()
    question, _ = question_source.reset(seed=task)
    messages = [{"role": "user", "content": question}]
    valid = []
    client = OpenAI(base_url=base_url, api_key=api_key, http_client=HTTP)
    for _ in range(max_calls):
        reply = client.chat.completions.create(model="tiny-agent", messages=messages, tools=[CALCULATOR],
                                               max_tokens=24)
        message = reply.choices[0].message
        if message.tool_calls:
            messages.append(message)  # the assistant message as returned (the client serializes it)
            results = [calculator(call.function.arguments) for call in message.tool_calls]
            messages += [{"role": "tool", "tool_call_id": call.id, "content": content}
                         for call, (content, _) in zip(message.tool_calls, results)]
            valid.append(all(ok for _, ok in results))
            continue
        answer = re.search(r"<answer>(.*?)</answer>", message.content or "", re.DOTALL)
        if answer:
            right = answer.group(1).strip() == str(question_source.answer)
            return {"reward": float(right), "valid": valid + [True]}
        valid.append(False)
        messages += [{"role": "assistant", "content": message.content or ""}, {"role": "user", "content": NUDGE}]
    return {"reward": 0.0, "valid": valid, "truncated": True}
