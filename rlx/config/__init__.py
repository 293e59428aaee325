"""rlx's configuration: where it lives (paths), the typed schemas (schema: the primary configs and the check;
groups and families: the dataclasses of the groups and of the algorithm families; fields: how a field declares
its type, range or choices), the cross-field rules (rules, seed_rules), the command line's overrides with one-line
errors (overrides), the names other libraries use (peer_names), the user's modules imported before a check
(plugins) and the registries they can add to, by kind (registries: `rlx.register`).

`rlx.config.UserError` is the exception the Python API raises for a user's mistake (kept here for user code).
"""

from omegaconf import OmegaConf

from rlx.errors import UserError

__all__ = ["UserError"]


def model_lr(full: float, lora_enabled: bool, lora_lr: float | None) -> float:
    """optim.lr's default (conf/train.yaml): the model preset's learning rate for what trains, its own
    `model.lora.lr` when LoRA adapters train and the preset sets one (adapters take a ~10-20x larger rate
    than a full fine-tune), else `model.lr`. An explicit optim.lr= replaces the interpolation."""
    return lora_lr if lora_enabled and lora_lr is not None else full


if not OmegaConf.has_resolver("rlx_lr"):  # every config is composed after some rlx.config module is imported
    OmegaConf.register_new_resolver("rlx_lr", model_lr)


# model.answer.prompt -> the user message a task's question is put in (data.prompt_template and the benchmarks'
# prompt_template default to `${rlx_prompt:${model.answer.prompt}}`); the answer is then read by model.answer.reader
ANSWER_PROMPTS = {
    "tags": "{question}\nGive the final answer as <answer>...</answer>.",  # a model trained to answer in tags
    "bare": "{question}",  # the question alone: an instruct model answers in its own words ("The answer is 10.")
}


def answer_prompt(mode: str) -> str:
    """The prompt template of model.answer.prompt `mode` (ANSWER_PROMPTS); an unknown mode: one line (UserError)."""
    if mode not in ANSWER_PROMPTS:
        raise UserError(f"unknown model.answer.prompt '{mode}'; valid choices: {', '.join(ANSWER_PROMPTS)}")
    return ANSWER_PROMPTS[mode]


if not OmegaConf.has_resolver("rlx_prompt"):
    OmegaConf.register_new_resolver("rlx_prompt", answer_prompt)
