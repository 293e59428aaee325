"""rollout.sampler=v3 (the default): v2's draw on the logits of the oneDNN decode step. The draw is versioned, so a
run made with v2 keeps drawing what it drew (F.linear decode), and one made before versions keeps v1."""

import pytest
import torch

from rlx.config.overrides import check_overrides
from rlx.engines.fast_decode import onednn_available
from rlx.engines.generator import HFGenerator, policy_generator
from rlx.engines.hf import Decoding, generate_tokens
from rlx.engines.sampling import ONEDNN_DECODE, SAMPLERS, sample_tokens
from tests.loop_fixtures import PROMPTS, one_thread, tiny_policy  # noqa: F401 (fixture)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_v3_draws_what_v2_draws_from_the_same_logits():
    g = torch.Generator().manual_seed(3)
    logits, seeds = torch.randn(16, 3000, generator=g), torch.arange(16)
    for top_k, top_p in ((0, 1.0), (20, 1.0), (0, 0.9)):
        assert torch.equal(sample_tokens(logits, seeds, 4, 0.8, top_k, top_p, "v3"),
                           sample_tokens(logits, seeds, 4, 0.8, top_k, top_p, "v2"))
    assert SAMPLERS["v3"] is SAMPLERS["v2"] and ONEDNN_DECODE == {"v3"}


def _generate(model, tokenizer, sampler, onednn):
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    width = max(map(len, ids))
    prompt = torch.tensor([[tokenizer.pad_token_id] * (width - len(r)) + r for r in ids])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in ids])
    decoding = Decoding(samples_per_prompt=4, max_new_tokens=24, sampler=sampler, onednn=onednn, logprobs=True)
    return generate_tokens(model, tokenizer, prompt, mask, decoding, seeds=list(range(12)))


@pytest.mark.skipif(not onednn_available(torch.zeros(1)), reason="oneDNN decode needs a CPU with mkldnn")
def test_v3_is_the_onednn_decode_and_v2_the_linear_one():
    """v3 generation equals v2's draw with the oneDNN decode (rollout.onednn_decode=true) bit for bit, and differs from
    v2's F.linear decode (which tests/test_sampling.py holds equal to transformers' own generate: what every v2 run
    drew before v3 existed) by float rounding only."""
    model, tokenizer = tiny_policy()
    v3, onednn_v2, v2 = (_generate(model, tokenizer, *a) for a in (("v3", False), ("v2", True), ("v2", False)))
    assert torch.equal(v3.completion_ids, onednn_v2.completion_ids) and torch.equal(v3.logprobs, onednn_v2.logprobs)
    assert not torch.equal(v3.logprobs, v2.logprobs)  # the two decodes round differently (so: two versions)
    both = (v3.completion_mask * v2.completion_mask).bool()
    assert (v3.logprobs - v2.logprobs)[both].abs().max() < 1e-4  # ... by float rounding only


def test_the_default_config_samples_with_v3_and_a_recorded_v2_stays_v2():
    model, tokenizer = tiny_policy()
    default = check_overrides([]).rollout
    assert default.sampler == "v3" and policy_generator(model, tokenizer, default).sampler == "v3"
    old = check_overrides(["rollout.sampler=v2"]).rollout
    generator = policy_generator(model, tokenizer, old)
    assert isinstance(generator, HFGenerator) and generator.sampler == "v2" and not generator.onednn
