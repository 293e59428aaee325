"""The stages of the single-turn producer (issue 29's seed ideas; issue 36): what happens to one draw of prompts
between scoring and dynamic sampling, with whole groups in view. One file per stage; each owns its knobs, its
state and its metrics, and is an entry of the STAGES registry (a user's own stage is one file of theirs:
docs/extending/stages.md).

rlx/rollout/single_turn.py `sample_batch` passes every draw through the active stages, in this order (ORDER):
  1. verifier_noise (algorithm.verifier_noise): the accuracy verdict flipped at the configured rates;
     then the draw's first_correct is recorded (the verdict on the samples as drawn);
  2. replay (algorithm.replay): a collapsed group gets a buffered sample of the missing kind;
  3. hints (algorithm.hints): an all-fail group is re-sampled with a prefix of the reference solution;
  4. shaping (algorithm.shapers): group reward shaping, the SHAPERS registry in the configured order;
  5. temperature_schedule (rollout.temperature_schedule): the step's per-position temperatures (EAD);
  6. the user's stages named in algorithm.stages, in their listed order.
Dynamic sampling then drops the groups of algorithm.dynamic_sampling_drop (DROP_STRATEGIES). After the step's last
draw each stage's `after_step` updates its state and returns its metrics, and the prompt source observes the
verdicts of every group drawn (rlx/data/sources.py; the difficulty sampler learns pass rates there). The state
(replay buffer, LASER-D targets; the prompt source is the producer's "data") is checkpointed through
SingleTurnProducer.checkpointed(), so a resumed run continues exactly.

With hardware.num_processes > 1, rank 0 runs them: it samples the step's global batch and broadcasts it
(rlx/rollout/rank_zero.py; rlx/config/async_rules.py rank_zero_reason names the knob that asks for it). With
rollout.partial=true the partial producer (rlx/rollout/partial.py) runs the same pipeline on the groups each step
finishes, as one draw; the temperature schedule and prompt sampling are refused there (rlx/config/async_rules.py).
"""

from rlx.rollout.stages import hints, replay, shaping, temperature, verifier_noise  # noqa: F401  (register)
from rlx.rollout.stages.base import STAGES, ScoredDraw, Stage, StageContext, StageSettings, mean_logprobs
from rlx.rollout.stages.order import ORDER, StagePipeline, build_stages

__all__ = ["ORDER", "STAGES", "ScoredDraw", "Stage", "StageContext", "StagePipeline", "StageSettings", "build_stages",
           "mean_logprobs"]
