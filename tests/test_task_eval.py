"""In-training task evaluation (rlx/evaluation/tasks.py) decodes through the Generator protocol, so it honours
rollout.backend: greedy rows of the eval budget through whatever generator the run holds, and under rollout=hf
exactly the completions and figures of the former text-in path (rlx.engines.hf.generate)."""

import torch

from rlx.engines.generator import HFGenerator
from rlx.engines.records import Generation
from rlx.evaluation.tasks import TaskEvalSettings, evaluate
from rlx.fleet.backends import EVAL_BACKENDS, ROLLOUT_BACKENDS, eval_generator
from rlx.models.loading import load_causal_lm, load_tokenizer
from rlx.rewards import RewardComponent
from rlx.rewards.rule import exact_match

ROWS = [{"prompt": f"{a} + {b} =", "answer": str(a + b)} for a, b in [(1, 2), (3, 4), (5, 6), (7, 1), (2, 2)]]
REWARDS = [RewardComponent("correct", exact_match, 1.0)]


def _settings(**overrides) -> TaskEvalSettings:
    fields = {"accuracy_key": "correct", "use_chat_template": True, "system_prompt": None, "max_new_tokens": 7,
              "batch_size": 2, **overrides}
    return TaskEvalSettings(**fields)


class RecordingGenerator:
    """A Generator that answers every row with the same ids and records how it was asked."""

    version = 3

    def __init__(self, reply: list[int], stop: bool = True):
        self.reply, self.stop, self.calls = reply, stop, []

    def generate_ids(self, prompts, **kwargs):
        self.calls.append({"prompts": prompts, **kwargs})
        rows = len(prompts) * kwargs.get("samples_per_prompt", 1)
        return Generation([list(self.reply) for _ in range(rows)], None, [self.stop] * rows)


def test_task_eval_asks_the_generator_for_greedy_rows_of_the_eval_budget():
    """evaluate hands the run's generator the rendered prompts as token ids, one greedy row each, at the eval
    budget with no minimum length; the metrics and records come from what it returned."""
    tok = load_tokenizer("builtin:tiny")
    reply = tok("<answer>3</answer>", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    generator = RecordingGenerator(reply)
    metrics, records = evaluate(generator, tok, ROWS, REWARDS, _settings(max_new_tokens=11), step=4)
    (call,) = generator.calls
    assert call["greedy"] is True and call["max_new_tokens"] == 11 and call["samples_per_prompt"] == 1
    assert call.get("min_new_tokens", 0) == 0 and call.get("continuation") is None
    assert len(call["prompts"]) == len(ROWS) and len(call["seeds"]) == len(ROWS)
    assert all(isinstance(p, list) and p and isinstance(p[0], int) for p in call["prompts"])
    assert [r["completion"] for r in records] == ["<answer>3</answer>"] * len(ROWS)
    assert metrics["eval/accuracy"] == torch.tensor(1 / len(ROWS)).item()  # only 1 + 2 = 3 (float32 mean)
    assert metrics["eval/mean_length"] == len(reply) and metrics["eval/truncated_frac"] == 0.0


def test_task_eval_through_the_policy_generator_is_the_former_generate_path():
    """rollout=hf: evaluate through eval_policy_generator (the backend's eval generator) gives the completions,
    lengths and truncation of rlx.engines.hf.generate(greedy, eval batch size) on the same rendered prompts, and
    leaves the torch RNG where generate left it (it drew the rows' seeds)."""
    from rlx.engines.hf import generate
    from rlx.rollout.prompts import format_prompts

    tok, model = load_tokenizer("builtin:tiny"), load_causal_lm("builtin:tiny")
    settings = _settings()
    generator = eval_generator("hf", None, model, tok, settings.batch_size)
    torch.manual_seed(5)
    metrics, records = evaluate(generator, tok, ROWS, REWARDS, settings)
    after_eval = torch.get_rng_state()
    torch.manual_seed(5)
    prompts = format_prompts(tok, ROWS, True, None)
    former = generate(model, tok, prompts, samples_per_prompt=1, max_new_tokens=7, greedy=True, batch_size=2)
    assert torch.equal(after_eval, torch.get_rng_state())
    assert [r["completion"] for r in records] == former.texts
    assert metrics["eval/mean_length"] == former.lengths.float().mean().item()
    assert metrics["eval/truncated_frac"] == former.truncated.float().mean().item()
    assert len(set(former.texts)) > 1  # the prompts really decoded differently


def test_eval_generator_by_backend():
    """hf: the trainer's policy decoding itself at the eval batch size (the default decode step and draw, no
    log-probs, whatever the run's rollout sampler is); vllm / server: the run's own generator (engine or server)."""
    assert set(EVAL_BACKENDS) == set(ROLLOUT_BACKENDS)
    run_generator = RecordingGenerator([1])
    hf = eval_generator("hf", run_generator, "policy", "tokenizer", 24)
    assert isinstance(hf, HFGenerator) and hf.model == "policy" and hf.batch_size == 24
    assert hf.with_logprobs is False and hf.sampler == "v2" and not hf.onednn
    for backend in ("vllm", "server"):
        assert eval_generator(backend, run_generator, "policy", "tokenizer", 24) is run_generator
