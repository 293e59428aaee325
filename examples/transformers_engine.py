"""An engine of your own, in one file: samples through transformers' own `generate`, one row at a time.

    rlx train plugins=[examples.transformers_engine] rollout.engine=transformers_generate

(from the repository root; rollout=hf, any policy-gradient or PPO algorithm). rlx calls it as it calls its own
decoder: token-id prompts in, each row seeded by its own seed, the sampled ids and the sampler's log-probs out; the
update changes the policy module it holds in place, and `publish` tells it the version. It declares what it gives
(nothing beyond plain sampling), so partial rollouts, a temperature schedule or pipeline mode stop in one line.
"""

from __future__ import annotations

import torch

import rlx
from rlx.engines.generator import QuietLifecycle
from rlx.engines.hf import eos_ids
from rlx.engines.records import Generation
from rlx.errors import UserError


@rlx.register("engine", "transformers_generate", gives={})
class TransformersGenerate(QuietLifecycle):
    def __init__(self, settings, model, tokenizer, seed: int):
        self.model, self.settings, self.pad = model, settings, tokenizer.pad_token_id
        self.stops, self.version, self.calls = eos_ids(model, tokenizer), 0, 0

    def generate_ids(self, prompts, *, max_new_tokens, seeds, greedy=False, samples_per_prompt=1, min_new_tokens=0,
                     continuation=None, schedule=None) -> Generation:
        if continuation is not None or schedule is not None:
            raise UserError("rollout.engine=transformers_generate neither continues rows nor takes a schedule")
        self.calls += 1
        s, rows = self.settings, [p for p in prompts for _ in range(samples_per_prompt)]
        ids, logprobs = [], []
        for prompt, seed in zip(rows, seeds):
            torch.manual_seed(seed)  # the row's own seed: the same row draws the same tokens in any batch
            out = self.model.generate(torch.tensor([prompt]), do_sample=not greedy, temperature=s.temperature,
                                      top_p=s.top_p, top_k=s.top_k or None, max_new_tokens=max_new_tokens,
                                      min_new_tokens=min_new_tokens, pad_token_id=self.pad, eos_token_id=self.stops,
                                      output_scores=True, return_dict_in_generate=True)
            new = out.sequences[0, len(prompt):]
            scores = torch.log_softmax(torch.stack(out.scores)[:, 0].float(), dim=-1)  # the sampler's (T, V)
            ids.append(new.tolist())
            logprobs.append(scores.gather(1, new[:, None])[:, 0].tolist())
        return Generation(ids, logprobs, [bool(r) and r[-1] in self.stops for r in ids])

    def publish(self, model, version: int) -> None:
        self.version = version  # the policy module itself was updated in place

    def step_metrics(self) -> dict[str, float]:
        calls, self.calls = self.calls, 0
        return {"rollout/engine_calls": float(calls)}
