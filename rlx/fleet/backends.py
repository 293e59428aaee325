"""rollout.backend -> the Generator that samples for a run (rlx/engines/generator.py protocol).

hf: the policy samples itself (HFGenerator on the policy's own module: the update changes what it samples, and
`publish` only moves the version), or an engine of the user's with rollout.engine=NAME (rlx/engines/custom.py);
vllm: an in-process vLLM engine (rlx/engines/vllm.py); server: a stock vLLM OpenAI server, a child process or the
user's URLs (rlx/fleet/server.py). vLLM is imported only when chosen.
"""

from __future__ import annotations

from rlx.config.groups import Rollout
from rlx.engines.custom import BUILTIN, ENGINES
from rlx.engines.generator import eval_policy_generator, policy_generator
from rlx.errors import UserError


def _hf(rollout: Rollout, model, tokenizer, seed: int):
    if rollout.engine != BUILTIN:  # an engine of the user's (rlx.register("engine", NAME): rlx/engines/custom.py)
        return ENGINES[rollout.engine](rollout, model, tokenizer, seed)
    return policy_generator(model, tokenizer, rollout)


def _vllm(rollout: Rollout, model, tokenizer, seed: int):
    from rlx.engines.vllm import vllm_engine

    return vllm_engine(rollout, model, tokenizer, seed)


def _server(rollout: Rollout, model, tokenizer, seed: int):
    from rlx.fleet.server import build_server_generator

    return build_server_generator(rollout, model, tokenizer, seed)


# rollout.backend -> fn(rollout, model, tokenizer, seed) -> a Generator
ROLLOUT_BACKENDS = {"hf": _hf, "vllm": _vllm, "server": _server}


def build_generator(rollout: Rollout, model, tokenizer, seed: int):
    """The generator of rollout.backend, built on the unprepared policy (Accelerate's prepare keeps the same module
    object, so the policy that samples is the one the update changes)."""
    backend = rollout.backend
    if backend not in ROLLOUT_BACKENDS:
        raise UserError(f"unknown rollout.backend '{backend}'; valid choices: {', '.join(ROLLOUT_BACKENDS)}")
    return ROLLOUT_BACKENDS[backend](rollout, model, tokenizer, seed)


def _policy_eval(generator, policy, tokenizer, batch_size: int):
    return eval_policy_generator(policy, tokenizer, batch_size)


def _run_generator(generator, policy, tokenizer, batch_size: int):
    return generator


# rollout.backend -> fn(the run's generator, the trainer's policy, tokenizer, eval batch size) -> the Generator that
# in-training evaluation decodes through
EVAL_BACKENDS = {"hf": _policy_eval, "vllm": _run_generator, "server": _run_generator}
assert set(EVAL_BACKENDS) == set(ROLLOUT_BACKENDS)


def eval_generator(backend: str, generator, policy, tokenizer, batch_size: int):
    """The Generator held-out task evaluation decodes through, by rollout.backend. hf: the trainer's policy itself
    with the evaluation's decoding (eval_policy_generator: `batch_size` rows at a time, the default decode step);
    vllm / server: the run's generator, the engine or server holding the weights published after the last update
    (in pipeline mode the run's generator samples the trainer's current policy itself: rollout/pipeline.py)."""
    return EVAL_BACKENDS[backend](generator, policy, tokenizer, batch_size)
