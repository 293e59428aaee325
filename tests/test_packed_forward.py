"""Packed (padding-free) training forward (rlx/models/forward.py _packed_hidden): the rows' real tokens run as one
sequence with restarting position ids and no attention across rows; log-probs, entropies and gradients equal
the padded forward's (issue 19)."""

import pytest
import torch

from rlx.models.forward import LogprobSettings, completion_logprobs
from rlx.models.loading import load_causal_lm
from tests.test_trim_padding import _batch


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    from rlx.models.shapes import build_shaped_model

    folder = build_shaped_model("qwen3-0.6b", tmp_path_factory.mktemp("qwen3"), num_layers=2, vocab_size=1024)
    return load_causal_lm(str(folder), "float32")


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_packed_forward_equals_the_padded_one(arch, request):
    torch.manual_seed(0)
    model = load_causal_lm("builtin:tiny", "float32") if arch == "llama" else request.getfixturevalue("qwen3")
    batch = _batch()
    batch = (batch[0], batch[1], batch[2].clone(), batch[3])
    batch[2][1] = torch.tensor([23, 30, 31, 32, 33, 34])  # tokens after a row's end must not leak into the pack
    mask = batch[3].bool()
    shapes = []
    hook = model.model.embed_tokens.register_forward_hook(lambda module, args, out: shapes.append(tuple(args[0].shape)))
    results = {}
    for pack in (False, True):
        model.zero_grad()
        shapes.clear()
        logp, entropy = completion_logprobs(model, *batch, with_entropy=True, temperature=0.7,
                                            settings=LogprobSettings(entropy_grad=True, trim=False, pack=pack))
        ((logp * mask).sum() + (entropy * mask).sum()).backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        results[pack] = (logp.detach(), entropy.detach(), grads, list(shapes))
    hook.remove()
    (lp0, en0, g0, _), (lp1, en1, g1, packed_shapes) = results[False], results[True]
    assert packed_shapes == [(1, 15)]  # one sequence: prompts 2 + 4 + 3 and completions 3 + 1 + 2 real tokens
    assert lp1.shape == (3, 6) and (lp1[~mask] == 0).all()
    assert torch.allclose(lp1[mask], lp0[mask], atol=1e-5) and torch.allclose(en1[mask], en0[mask], atol=1e-5)
    assert torch.allclose(g1, g0, atol=1e-5, rtol=1e-4)


def test_packed_value_model_equals_the_padded_one():
    """PPO's critic (models/value.py) with pack=True: the same values and gradients on real completion tokens."""
    from rlx.models.value import build_value_model

    torch.manual_seed(0)
    critic = build_value_model(load_causal_lm("builtin:tiny", "float32"))
    torch.nn.init.normal_(critic.head.weight, std=0.1)  # the head starts at zero: make values depend on the states
    batch = _batch()
    mask = batch[3].bool()
    results = {}
    for pack in (False, True):
        critic.zero_grad()
        values = critic(*batch, pack=pack)
        (values * mask).pow(2).sum().backward()
        grads = torch.cat([p.grad.flatten() for p in critic.parameters() if p.grad is not None])
        results[pack] = (values.detach(), grads)
    (v0, g0), (v1, g1) = results[False], results[True]
    assert v1.shape == v0.shape == (3, 6) and (v1[~mask] == 0).all()
    assert torch.allclose(v1[mask], v0[mask], atol=1e-5) and torch.allclose(g1, g0, atol=1e-5, rtol=1e-4)
