"""A prefix every prompt starts with (few-shot examples) is encoded once per batch, its keys and values copied to
every row, in both of rlx's scorers: generation (HFGenerator share_prefix, rlx eval's generator) draws the same
tokens with the same log-probs as encoding each prompt whole, and feeds the prefix once."""

import pytest
import torch

from rlx.engines.generator import DecodeStep, HFGenerator, common_prefix, prefix_pad


def test_common_prefix_and_its_padding_by_hand():
    assert common_prefix([[1, 2, 3, 4], [1, 2, 3, 9, 9], [1, 2, 7]], minimum=1) == 2
    assert common_prefix([[1, 2, 3], [1, 2, 3, 4]], minimum=1) == 2  # each prompt keeps one token of its own
    assert common_prefix([[1, 2, 3, 4], [1, 2, 3, 5]], minimum=4) == 0
    assert common_prefix([[1, 2, 3, 4]], minimum=1) == 0
    ids, mask = prefix_pad([[5, 6, 1], [5, 6, 2, 3, 4]], pad_id=0, shared=2)
    assert ids.tolist() == [[5, 6, 0, 0, 1], [5, 6, 2, 3, 4]]
    assert mask.tolist() == [[1, 1, 0, 0, 1], [1, 1, 1, 1, 1]]


@pytest.fixture(scope="module")
def tiny():
    from rlx.config.paths import ASSETS_DIR
    from rlx.models.loading import load_causal_lm, load_tokenizer

    return load_causal_lm(str(ASSETS_DIR / "tiny")).eval(), load_tokenizer(str(ASSETS_DIR / "tiny"))


@pytest.mark.parametrize("greedy", [True, False])
def test_a_shared_prefix_is_encoded_once_and_draws_the_same_tokens(tiny, greedy):
    model, tokenizer = tiny
    g = torch.Generator().manual_seed(0)
    head = torch.randint(5, 200, (40,), generator=g).tolist()
    prompts = [head + torch.randint(5, 200, (n,), generator=g).tolist() for n in (3, 9, 1, 6, 4)]
    fed = []
    hook = model.register_forward_pre_hook(lambda m, a, kw: fed.append(kw["input_ids"].numel()), with_kwargs=True)
    try:
        runs = {}
        for share in (False, True):
            fed.clear()
            generator = HFGenerator(model, tokenizer, temperature=1.0, batch_size=2, logprobs="sampler",
                                    decode=DecodeStep(share_prefix=share))
            out = generator.generate_ids(prompts, max_new_tokens=8, seeds=[11, 12, 13, 14, 15], greedy=greedy)
            runs[share] = (out, sum(fed))
    finally:
        hook.remove()
    (plain, fed_plain), (shared, fed_shared) = runs[False], runs[True]
    assert shared.ids == plain.ids
    for a, b in zip(shared.logprobs, plain.logprobs):
        assert a == pytest.approx(b, abs=1e-4)
    assert fed_plain - fed_shared >= 40 * (len(prompts) - 3)  # the prefix once per chunk of 2 (3 chunks), not per row
