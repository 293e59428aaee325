"""Agent warm start (family `agent_sft`): behaviour cloning of a partly skilled demonstrator, read top to bottom.

Each step plays `prompts_per_step` x rollout.samples_per_prompt demonstration episodes through the
same token-in/token-out rollout as RL (rollout/env.py), the model replaced by envs/demos.py's
ExpertGenerator: the environment's expert move with probability algorithm.skill, a plausible mistake
otherwise. The policy takes one optimizer step on the token-mean negative log-likelihood of the
demonstrated turns (loss mask 1; environment tokens are context only). Demonstration seeds come from
(seed, step), so a resumed run sees the same demonstrations. Held-out evaluation: episodes of the
policy itself, as in the agent loop. With several processes (hardware=ddp), each plays its contiguous
shard of the demonstrations (a demonstration depends only on its global index: its seed and its
mistakes), the loss is normalised by the global token count and DDP sums the gradients, so N processes
take the step one process takes (rlx/runtime/parallel.py); held-out episodes are split over processes.
"""

from __future__ import annotations

import logging
import time

from accelerate.utils import gather_object

from rlx.engines.records import Rollout
from rlx.envs import env_factory
from rlx.envs.demos import ExpertGenerator
from rlx.errors import EnvError, UserError
from rlx.loops.common import SamplingParts, end_step, eval_due, evaluate_at_start
from rlx.models.forward import completion_logprobs
from rlx.rollout.env import TurnDecoding, run_episodes, train_env_seed
from rlx.rollout.episodes import episode_metrics
from rlx.rollout.failures import EpisodeFailureWatch
from rlx.runtime.optim import optimizer_step
from rlx.runtime.parallel import backward, global_sum, shard

log = logging.getLogger("rlx")


def train_agent_sft(settings, parts: SamplingParts) -> dict:
    algo, env = settings.algorithm, settings.env
    acc, tokenizer = parts.accelerator, parts.tokenizer
    try:
        factory = env_factory(env.name, env.target, env.kwargs)
    except EnvError as exc:
        raise UserError(str(exc)) from None
    model, optimizer, scheduler = parts.model, parts.optimizer, parts.scheduler
    checkpointer, metrics_log, run_eval = parts.checkpointer, parts.metrics_log, parts.run_eval
    start_step = checkpointer.restore(**parts.checkpointed)
    last_eval = evaluate_at_start(settings.eval.at_start, start_step, metrics_log, run_eval)
    group = settings.rollout.samples_per_prompt
    failures = EpisodeFailureWatch(env.stop_after_failed_steps, factory)  # a broken environment stops the run
    for step in range(start_step + 1, settings.steps + 1):
        start = time.perf_counter()
        tasks = shard(settings.prompts_per_step, acc)  # this process's demonstrations: global indices `mine`
        mine = list(range(tasks.start * group, tasks.stop * group))
        seeds = [train_env_seed(settings.seed, step, i) for i in mine]  # one task per demonstration
        envs = {i: factory() for i in mine}
        expert = ExpertGenerator(envs, tokenizer, algo.skill, seed=settings.seed * 1_000_003 + step)
        episodes = run_episodes(expert, tokenizer, list(envs.values()), seeds, mine, env,
                                TurnDecoding(use_chat_template=settings.model.chat_template,
                                             stop_ids=[tokenizer.eos_token_id]))
        demos = gather_object(episodes)  # every process's demonstrations, in global order
        failures.observe(step, demos)
        batch = Rollout.from_episodes(episodes, tokenizer.pad_token_id)
        total_tokens = max(global_sum(acc, float(batch.loss_mask.sum())), 1.0)  # token-mean over the global batch
        loss_sum = 0.0
        for lo in range(0, len(mine), settings.micro_batch_size):
            sl = slice(lo, lo + settings.micro_batch_size)
            logp, _ = completion_logprobs(model, batch.prompt_ids[sl], batch.prompt_mask[sl], batch.completion_ids[sl],
                                          batch.completion_mask[sl])
            mask = batch.loss_mask[sl].to(logp.device, logp.dtype)
            loss = -(logp * mask).sum() / total_tokens  # token-mean NLL over the demonstrated turns
            backward(acc, loss, model)
            loss_sum += loss.item()
        grad_norm = optimizer_step(acc, model, optimizer, scheduler, settings.optim.max_grad_norm)
        parts.generator.publish(acc.unwrap_model(model), step)  # held-out episodes play the updated policy
        metrics = {
            "train/loss": global_sum(acc, loss_sum),
            "train/lr": scheduler.get_last_lr()[0],
            "train/grad_norm": grad_norm,
            **episode_metrics(demos, "demo"),
            "perf/step_time_s": time.perf_counter() - start,
        }
        if eval_due(step, settings.eval.every, settings.steps):
            last_eval = run_eval(step)
            metrics.update(last_eval)
        end_step(step, metrics, metrics_log, checkpointer, settings.log.every, settings.steps)
    metrics_log.close()
    return {"model": model, "final_eval": last_eval}
