"""Padding columns shared by a whole micro-batch are not computed (rlx/models/forward.py trim_padding): the
log-probs, entropies and gradients of the real tokens equal the untrimmed forward's (issue 19)."""

import pytest
import torch

from rlx.models.forward import LogprobSettings, completion_logprobs, trim_padding
from rlx.models.loading import load_causal_lm


def _batch(pad: int = 0):
    """3 rows: prompts of 2-4 tokens left-padded to 7, completions of 1-3 tokens right-padded to 6."""
    prompts = [[5, 6], [7, 8, 9, 10], [11, 12, 13]]
    completions = [[20, 21, 22], [23], [24, 25]]
    p_ids = torch.full((3, 7), pad)
    p_mask = torch.zeros(3, 7, dtype=torch.long)
    c_ids = torch.full((3, 6), pad)
    c_mask = torch.zeros(3, 6, dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompts, completions)):
        p_ids[i, 7 - len(p):] = torch.tensor(p)
        p_mask[i, 7 - len(p):] = 1
        c_ids[i, : len(c)] = torch.tensor(c)
        c_mask[i, : len(c)] = 1
    return p_ids, p_mask, c_ids, c_mask


def test_trim_padding_drops_only_shared_padding():
    p_ids, p_mask, c_ids, c_mask = trim_padding(*_batch())
    assert p_ids.shape == (3, 4) and c_ids.shape == (3, 3)
    assert p_mask.sum() == 9 and c_mask.sum() == 6  # every real token kept


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    from rlx.models.shapes import build_shaped_model

    folder = build_shaped_model("qwen3-0.6b", tmp_path_factory.mktemp("qwen3"), num_layers=1, vocab_size=1024)
    return load_causal_lm(str(folder), "float32")


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("chunked", [True, False])
def test_trimmed_forward_equals_the_padded_one(arch, chunked, request):
    torch.manual_seed(0)
    model = load_causal_lm("builtin:tiny", "float32") if arch == "llama" else request.getfixturevalue("qwen3")
    batch = _batch()
    mask = batch[3].bool()
    results = {}
    for trim in (False, True):
        model.zero_grad()
        logp, entropy = completion_logprobs(model, *batch, with_entropy=True, temperature=0.7,
                                            settings=LogprobSettings(entropy_grad=True, chunked=chunked, trim=trim))
        ((logp * mask).sum() + (entropy * mask).sum()).backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        results[trim] = (logp.detach(), entropy.detach(), grads)
    (lp0, en0, g0), (lp1, en1, g1) = results[False], results[True]
    assert lp1.shape == lp0.shape == (3, 6)
    assert torch.allclose(lp1[mask], lp0[mask], atol=1e-5) and torch.allclose(en1[mask], en0[mask], atol=1e-5)
    assert torch.allclose(g1, g0, atol=1e-5, rtol=1e-4)
    if chunked:  # the chunked path leaves 0 wherever there is no completion token
        assert (lp1[~mask] == 0).all()
