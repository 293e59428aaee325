"""A healthy run prints no warning that is not about the user's own settings (issue 31).

Each shipped recipe family runs for two steps as a user runs it (`rlx train RECIPE`, made small), and every
line of its output that mentions a warning (Python's `...Warning:` lines, rlx's and the libraries' `[WARNING]`
log lines, `warning:` lines, a `--- Logging error ---` block) fails the test unless ALLOWED names it with the
reason. Sources found and fixed: the reward-model family's end-of-run `optimized_metric 'eval/accuracy' is not a
final metric` (auto now follows the family), peft's `Could not find a config file in builtin:tiny` at every LoRA
save (rlx decides save_embedding_layers itself). torch's `lr_scheduler.step() before optimizer.step()` on the
skipped-update path stays suppressed (checked by `tied_agent`, whose every update is skipped), and transformers'
FutureWarnings (peft's `is_gradient_checkpointing` call under LoRA) stay filtered by rlx.cli.quiet_libraries.
"""

import re

import pytest

from tests.conftest import run_rlx

SMALL = ["steps=2", "hardware.num_threads=1", "log.progress=false"]
SMALL_RL = ["prompts_per_step=2", "rollout.samples_per_prompt=2", "eval.size=4"]
SMALL_AGENT = ["prompts_per_step=2", "env.eval_episodes=4"]

FAMILIES = {
    "grpo": ["grpo_tiny", *SMALL_RL],
    "grpo_lora_kl": ["grpo_tiny", *SMALL_RL, "model.lora.enabled=true", "algorithm.kl_coef=0.01"],
    "ppo": ["ppo_tiny", *SMALL_RL],
    "dpo": ["dpo_tiny", "eval.size=4"],
    "reward_model": ["algorithm=reward_model", "data=prefs", "eval.size=4"],
    "sft": ["tiny_sft", "eval.size=4"],
    "agent_grpo": ["agent_grpo_corridor_tiny", *SMALL_AGENT],
    "gigpo": ["gigpo_corridor_tiny", *SMALL_AGENT],
    "agent_sft": ["tiny_agent_sft", *SMALL_AGENT],
    # every group tied (reward 0.5 whatever the model says): every update is skipped and the schedule steps alone
    "tied_agent": ["algorithm=agent_grpo", "env=custom", "env.target=tests.test_healthy_noise.Tied", "data.source=none",
                   "model.path=builtin:tiny_agent", *SMALL_AGENT],
}

# (pattern, why it may appear in a healthy run); none is needed today: add one only for a warning about the
# user's own settings, never to hide rlx's or a library's noise
ALLOWED: list[tuple[str, str]] = []

WARNING_LINE = re.compile(r"warn|logging error", re.IGNORECASE)


class Tied:
    """One turn, reward 0.5 whatever the action: every group of episodes ties."""

    def reset(self, *, seed=None, options=None):
        return "say anything", {}

    def step(self, action):
        return "done", 0.5, True, False, {}


def unexpected_warnings(output: str) -> list[str]:
    return [line for line in output.splitlines()
            if WARNING_LINE.search(line) and not any(re.search(pattern, line) for pattern, _ in ALLOWED)]


def test_the_check_sees_each_kind_of_warning_line():
    """The filter itself: Python warnings, log records of any logger, `warning:` lines and logging errors."""
    lines = ["/x/y.py:3: UserWarning: Detected call of `lr_scheduler.step()` before `optimizer.step()`",
             "[2026-01-01 00:00:00,000][rlx][WARNING] - optimized_metric 'eval/accuracy' is not a final metric",
             "[2026-01-01 00:00:00,000][transformers][WARNING] - something", "warning: could not write train.log",
             "--- Logging error ---"]
    assert unexpected_warnings("\n".join([*lines, "[rlx][INFO] - step 1/2  reward 0.5", "warmup_steps: 5"])) == lines


# in the fast suite: the runs where a warning was found (~15 s each); the other families with `make test-long`
FAST = ("reward_model", "grpo_lora_kl", "tied_agent")


@pytest.mark.parametrize("family", [f if f in FAST else pytest.param(f, marks=pytest.mark.long) for f in FAMILIES])
def test_a_healthy_run_of_each_family_prints_no_unexpected_warning(family, tmp_path):
    result = run_rlx(["train", *FAMILIES[family], *SMALL], tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert unexpected_warnings(result.stdout + result.stderr) == []


def test_lora_saves_decide_the_embeddings_without_asking_the_base_model():
    """peft's save_embedding_layers="auto" looks the base model's config up at every save (on the hub for a hub
    id) and warns when it cannot; rlx never resizes the vocabulary, so the answer is whether the adapter targets
    an embedding layer (embed_tokens / lm_head), and a regex target is left to peft."""
    from peft import LoraConfig, get_peft_model

    from rlx.models.loading import load_causal_lm
    from rlx.models.lora import saves_embeddings

    for targets, expected in (("all-linear", False), (["q_proj", "lm_head"], True), (["q_proj", "v_proj"], False),
                              (r".*\.q_proj", "auto")):
        model = get_peft_model(load_causal_lm("builtin:tiny"), LoraConfig(r=2, target_modules=targets))
        assert saves_embeddings(model) == expected, targets
