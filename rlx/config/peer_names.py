"""TRL and verl option names, and the rlx setting each corresponds to.

An unknown key on the command line that is a peer's name (`num_generations=8`, `beta=0.04`,
`actor_rollout_ref.rollout.n=8`) gets a one-line pointer to the rlx name instead of a spelling guess
(the nearest rlx key to `beta` is `optim.betas`, the wrong knob). The mapping table of
docs/coming-from-trl.md lists the same pairs (tests/test_docs.py checks that each of its names gets a
pointer). A key is matched in full, then by its dotted suffixes (`algorithm.beta` -> `beta`).
"""

from __future__ import annotations

# peer key -> (rlx setting, "WHO detail"): WHO is the peer using the name (TRL, verl, transformers).
PEER_NAMES: dict[str, tuple[str, str]] = {
    # TRL (GRPOConfig / RLOOConfig / TrainingArguments)
    "num_generations": ("rollout.samples_per_prompt", "TRL"),
    "beta": ("algorithm.kl_coef", "TRL KL coefficient of GRPO; DPO's beta is algorithm.beta under algorithm=dpo"),
    "max_completion_length": ("rollout.max_new_tokens", "TRL"),
    "max_prompt_length": ("data.max_prompt_length", "TRL/verl"),
    "epsilon": ("algorithm.clip_low", "TRL (clip range below 1)"),
    "epsilon_low": ("algorithm.clip_low", "TRL"),
    "epsilon_high": ("algorithm.clip_high", "TRL (clip-higher)"),
    "delta": ("algorithm.dual_clip", "TRL two-sided clip; rlx has dual-clip for negative advantages"),
    "loss_type": ("algorithm.loss_agg", "TRL grpo/bnpo/dr_grpo/dapo -> token-mean | seq-mean-token-mean | "
                  "seq-mean-token-sum-norm; or pick algorithm=dr_grpo / dapo"),
    "scale_rewards": ("algorithm.scale", "TRL true/false/'group'/'batch' -> group | none | batch"),
    "num_iterations": ("algorithm.epochs", "TRL"),
    "learning_rate": ("optim.lr", "TRL/transformers"),
    "per_device_train_batch_size": ("micro_batch_size", "transformers"),
    "gradient_accumulation_steps": ("hardware.gradient_accumulation_steps", "transformers"),
    "max_steps": ("steps", "transformers"),
    "num_train_epochs": ("steps", "transformers; rlx counts optimizer-update rounds"),
    "warmup_steps": ("optim.warmup_steps", "transformers"),
    "lr_scheduler_type": ("optim.schedule", "transformers"),
    "max_grad_norm": ("optim.max_grad_norm", "transformers"),
    "use_vllm": ("rollout=vllm", "TRL"),
    "mask_truncated_completions": ("algorithm.mask_truncated", "TRL"),
    "top_entropy_quantile": ("algorithm.forking_rho", "TRL"),
    "importance_sampling_level": ("algorithm.ratio_level", "TRL (GSPO: sequence)"),
    "reward_weights": ("reward.components.<name>.weight", "TRL"),
    "report_to": ("logger", "transformers: logger=wandb | mlflow | tensorboard | trackio"),
    "output_dir": ("hydra.run.dir", "transformers; runs go to outputs/train/<time>_<name> by default"),
    "model_name_or_path": ("model.path", "TRL scripts"),
    "dataset_name": ("data=hub data.id", "TRL scripts"),
    # verl (ppo_trainer.yaml); suffixes of the full names match too
    "rollout.n": ("rollout.samples_per_prompt", "verl"),
    "actor_rollout_ref.rollout.n": ("rollout.samples_per_prompt", "verl"),
    "data.max_response_length": ("rollout.max_new_tokens", "verl"),
    "max_response_length": ("rollout.max_new_tokens", "verl"),
    "data.train_batch_size": ("prompts_per_step", "verl"),
    "train_batch_size": ("prompts_per_step", "verl"),
    "ppo_mini_batch_size": ("algorithm.mini_batches", "verl gives a size; rlx the number of mini-batches per batch"),
    "ppo_micro_batch_size_per_gpu": ("micro_batch_size", "verl"),
    "ppo_epochs": ("algorithm.epochs", "verl"),
    "adv_estimator": ("algorithm", "verl: algorithm=grpo | rloo | reinforce_pp | ppo (gae)"),
    "clip_ratio": ("algorithm.clip_low and algorithm.clip_high", "verl"),
    "clip_ratio_low": ("algorithm.clip_low", "verl"),
    "clip_ratio_high": ("algorithm.clip_high", "verl"),
    "clip_ratio_c": ("algorithm.dual_clip", "verl"),
    "loss_agg_mode": ("algorithm.loss_agg", "verl (same value names)"),
    "kl_loss_coef": ("algorithm.kl_coef", "verl (with algorithm.kl_in=loss)"),
    "use_kl_loss": ("algorithm.kl_in", "verl: kl_in=loss, or kl_in=reward for the in-reward penalty"),
    "kl_loss_type": ("algorithm.kl_estimator", "verl: low_var_kl is k3"),
    "kl_ctrl.kl_coef": ("algorithm.kl_coef", "verl (with algorithm.kl_in=reward)"),
    "kl_ctrl.target_kl": ("algorithm.kl_target", "verl"),
    "kl_ctrl.horizon": ("algorithm.kl_horizon", "verl"),
    "use_kl_in_reward": ("algorithm.kl_in", "verl: kl_in=reward"),
    "entropy_coeff": ("algorithm.entropy_coef", "verl"),
    "norm_adv_by_std_in_grpo": ("algorithm.scale", "verl: true -> group, false -> none"),
    "optim.lr_warmup_steps": ("optim.warmup_steps", "verl"),
    "actor.optim.lr": ("optim.lr", "verl (actor_rollout_ref.actor.optim.lr)"),
    "rollout.name": ("rollout", "verl: rollout=hf | vllm"),
    "trainer.logger": ("logger", "verl: logger=wandb | mlflow | tensorboard | trackio"),
    "total_training_steps": ("steps", "verl"),
    "total_epochs": ("steps", "verl; rlx counts optimizer-update rounds"),
    "model.path": ("model.path", "verl (actor_rollout_ref.model.path)"),
    "gamma": ("algorithm.gamma", "verl; a knob of algorithm=ppo (GAE)"),
    "lam": ("algorithm.lam", "verl; a knob of algorithm=ppo (GAE)"),
    "cliprange_value": ("algorithm.value_clip", "verl; a knob of algorithm=ppo"),
    "temperature": ("rollout.temperature", "TRL/verl"),
    "top_p": ("rollout.top_p", "TRL/verl"),
    "top_k": ("rollout.top_k", "TRL/verl"),
    "experiment_name": ("name", "verl trainer.experiment_name"),
    "project_name": ("logger.project", "verl trainer.project_name"),
}


def peer_pointer(key: str) -> str | None:
    """`error:` text for an unknown key that is a TRL/verl name, or None. Tries the whole key, then its
    dotted suffixes, longest first (`actor_rollout_ref.actor.clip_ratio_high` -> `clip_ratio_high`)."""
    parts = key.lstrip("+~").split(".")
    for start in range(len(parts)):
        suffix = ".".join(parts[start:])
        if suffix in PEER_NAMES:
            target, note = PEER_NAMES[suffix]
            if target == key.lstrip("+~"):  # an rlx name already (missing for another reason)
                return None
            setting = target if "=" in target or " " in target or "<" in target else f"{target}=..."
            who, _, detail = (note or "TRL/verl").partition(" ")
            detail = detail.strip("(); ").removeprefix("'s ").strip()
            who = who.rstrip(";").removesuffix("'s")
            return f"unknown key '{key}' is a {who} name; in rlx set {setting}" + (f" ({detail})" if detail else "")
    return None


def peer_pointers(keys: list[str]) -> str | None:
    """`error:` text for several unknown keys that are TRL/verl names: all of them in one line (a user coming
    from TRL often types several at once), or None when none is. One key gives peer_pointer's text."""
    pointers = [(key, peer_pointer(key)) for key in dict.fromkeys(keys)]
    pointers = [(key, text) for key, text in pointers if text is not None]
    if len(pointers) <= 1:
        return pointers[0][1] if pointers else None
    settings = [text.split("; in rlx set ", 1)[1] for _, text in pointers]
    return (f"{len(pointers)} unknown keys are TRL/verl names; in rlx set: "
            + "; ".join(f"{key} -> {setting}" for (key, _), setting in zip(pointers, settings)))
