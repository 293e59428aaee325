"""The built-in key-and-door corridor (rlx/envs/builtin.py) played through chat messages with the OpenAI client.

Train it (from the repository root; 60 steps of 4 corridors x 4 episodes, as recipe agent_grpo_corridor_tiny):

    PYTHONPATH=. rlx train agent_grpo_corridor_tiny env=harness env.target=examples.corridor_harness.run \
        env.max_new_tokens=3 env.max_turns=8 hardware.num_threads=1

Each observation is a user message, each reply an action ("L" or "R"). The conversation is the one
`env=corridor` plays (chat template, no system prompt), so the two runs can be compared directly
(docs/agents/harness.md has the numbers). The per-move rewards and the (position, has key) states are
returned as `rewards` and `anchors` (algorithm=gigpo works as with env=corridor), with the validity of
each action and whether the corridor's step limit cut the episode.
"""

from __future__ import annotations

import openai
from openai import OpenAI

from rlx.envs.builtin import Corridor

# one HTTP connection pool for every episode of this process: a client of its own per episode would build
# an SSL context each time (~35 ms of CPU), more than the tiny model takes to answer
HTTP = openai.DefaultHttpxClient()


def run(task, base_url, api_key, length: int = 5, max_steps: int = 8):
    env = Corridor(length=length, max_steps=max_steps)
    observation, info = env.reset(seed=task)  # task: the environment seed rlx draws for this episode
    messages = [{"role": "user", "content": observation}]
    rewards, anchors, valid = [], [], []
    client = OpenAI(base_url=base_url, api_key=api_key, http_client=HTTP)
    while True:
        anchors.append(info["anchor"])
        reply = client.chat.completions.create(model="tiny-agent", messages=messages, max_tokens=3)
        action = reply.choices[0].message.content or ""
        observation, reward, terminated, truncated, info = env.step(action)
        rewards.append(reward)
        valid.append(info["is_action_valid"])
        if terminated or truncated:
            break
        messages += [{"role": "assistant", "content": action}, {"role": "user", "content": observation}]
    return {"rewards": rewards, "success": info["metrics"]["success"], "anchors": anchors, "valid": valid,
            "truncated": truncated and not terminated}
