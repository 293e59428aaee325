"""Continuing a row from its token prefix (Generator.generate_ids(continuation=Continuation(prefixes=...)),
rlx/engines/hf.py) and stopping generation early (Continuation(stop_when=...)): what partial rollouts and hints
build on."""

import threading

import pytest
import torch

from rlx.engines.generator import Continuation, HFGenerator, refuse_continuation
from rlx.errors import UserError
from tests.loop_fixtures import PROMPTS, one_thread, tiny_policy  # noqa: F401 (fixture)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny():
    model, tokenizer = tiny_policy()
    return model, tokenizer, [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS[:2]]


@pytest.mark.parametrize("knobs", [{}, {"top_k": 5, "temperature": 0.7}, {"top_p": 0.8}, {"min_new_tokens": 6}],
                         ids=["plain", "top_k", "top_p", "min_new_tokens"])
def test_a_continued_row_draws_what_the_uninterrupted_row_drew(tiny, knobs):
    """Token t of a row is drawn from (its seed, position t): cut every row after k tokens (k = 0 .. length - 1,
    one cut per row, several rows of different cuts in one batch, two chunks) and continue it: prefix + new tokens
    equals the uninterrupted row, and the new tokens' log-probs equal the uninterrupted ones (float rounding: the
    prefix goes through a prefill instead of decode steps)."""
    model, tokenizer, prompts = tiny
    min_new = knobs.pop("min_new_tokens", 0)
    generator = HFGenerator(model, tokenizer, logprobs="sampler", batch_size=5, **knobs)
    seeds = list(range(40, 48))
    full = generator.generate_ids(prompts, max_new_tokens=20, seeds=seeds, samples_per_prompt=4, min_new_tokens=min_new)
    assert len({len(r) for r in full.ids}) > 1  # rows of different lengths, so the batch has rows that leave early
    checked = 0
    for shift in range(3):
        cuts = [(i * 3 + shift) % len(r) for i, r in enumerate(full.ids)]
        prefixes = [r[:c] for r, c in zip(full.ids, cuts)]
        more = generator.generate_ids(prompts, max_new_tokens=20, seeds=seeds, samples_per_prompt=4,
                                      min_new_tokens=min_new, continuation=Continuation(prefixes))
        for row, (prefix, new, whole) in enumerate(zip(prefixes, more.ids, full.ids)):
            assert prefix + new == whole, (row, prefix, new, whole)
            torch.testing.assert_close(torch.tensor(more.logprobs[row]), torch.tensor(full.logprobs[row][len(prefix):]),
                                       atol=1e-4, rtol=0)
            assert more.stopped[row] == full.stopped[row]
            checked += 1
    assert checked == 24


def test_stop_when_returns_the_rows_as_far_as_they_got(tiny):
    """stop_when is asked after every token with the finished rows; True ends generation: rows still going come back
    shorter than the budget and without a stop token (their continuation then finishes them as if uninterrupted)."""
    model, tokenizer, prompts = tiny
    generator = HFGenerator(model, tokenizer, logprobs="sampler", batch_size=3)
    seeds = list(range(8))
    full = generator.generate_ids(prompts, max_new_tokens=20, seeds=seeds, samples_per_prompt=4)
    asked = []

    def two_finished(finished):
        asked.append(finished.clone())
        return int(finished.sum()) >= 2

    part = generator.generate_ids(prompts, max_new_tokens=20, seeds=seeds, samples_per_prompt=4,
                                  continuation=Continuation(stop_when=two_finished))
    assert asked[-1].shape == (8,) and int(asked[-1].sum()) >= 2
    finished = [s or len(r) == 20 for s, r in zip(part.stopped, part.ids)]
    assert sum(finished) >= 2 and not all(finished)
    for got, whole, done in zip(part.ids, full.ids, finished):
        assert whole[: len(got)] == got and (got == whole) == done
    prefixes = part.ids
    rest = generator.generate_ids(prompts, max_new_tokens=20, seeds=seeds, samples_per_prompt=4,
                                  continuation=Continuation([p if not d else p[:-1]
                                                             for p, d in zip(prefixes, finished)]))
    for prefix, new, whole, done in zip(prefixes, rest.ids, full.ids, finished):
        assert (prefix if not done else prefix[:-1]) + new == whole


def test_an_interrupt_ends_generation_at_the_next_token(tiny):
    model, tokenizer, prompts = tiny
    generator = HFGenerator(model, tokenizer, logprobs="sampler")
    generator.interrupt = threading.Event()
    generator.interrupt.set()
    out = generator.generate_ids(prompts, max_new_tokens=20, seeds=list(range(8)), samples_per_prompt=4,
                                 min_new_tokens=20)
    assert all(len(r) == 1 for r in out.ids) and not any(out.stopped)


def test_other_backends_refuse_in_one_line():
    with pytest.raises(UserError, match="rollout=server cannot continue a row from its token prefix.*use rollout=hf"):
        refuse_continuation("server", Continuation(prefixes=[[1]]))
    with pytest.raises(UserError, match="rollout=vllm cannot"):
        refuse_continuation("vllm", Continuation(stop_when=lambda finished: False))
    refuse_continuation("vllm", None)
    refuse_continuation("vllm", Continuation())
    refuse_continuation("server", Continuation(prefixes=[[1]]), continues_prefixes=True)  # rounds
    with pytest.raises(UserError, match="rollout=server cannot stop generation early .* set rollout.segment_tokens"):
        refuse_continuation("server", Continuation(stop_when=lambda finished: False), continues_prefixes=True)


def test_rows_that_share_a_prompt_and_prefix_encode_it_once(tiny):
    """Four rows of a fresh group (empty prefixes) and two rows with one prefix: the prefill encodes 2 sequences, not
    6, and the rows drawn are those of the group sampled as samples_per_prompt (its prompt encoded once) and of the
    continued row alone."""
    from rlx.engines.generator import shared_prefixes

    model, tokenizer, prompts = tiny
    assert shared_prefixes([[1, 2], [1, 2], [3], [1, 2]]) == ([[1, 2], [3]], [0, 0, 1, 0])
    generator = HFGenerator(model, tokenizer, logprobs="sampler", batch_size=8)
    group = generator.generate_ids(prompts[:1], max_new_tokens=12, seeds=[1, 2, 3, 4], samples_per_prompt=4)
    alone = generator.generate_ids([prompts[1]], max_new_tokens=12, seeds=[5],
                                   continuation=Continuation(prefixes=[group.ids[0][:3]]))
    widths = []
    hook = model.register_forward_pre_hook(lambda _, args, kwargs: widths.append(kwargs["input_ids"].shape),
                                           with_kwargs=True)
    try:
        mixed = generator.generate_ids([prompts[0]] * 4 + [prompts[1]] * 2, max_new_tokens=12, seeds=[1, 2, 3, 4, 5, 5],
                                       continuation=Continuation(prefixes=[[]] * 4 + [group.ids[0][:3]] * 2))
    finally:
        hook.remove()
    assert widths[0][0] == 2  # the prefill: one row per distinct prompt + prefix
    assert mixed.ids[:4] == group.ids and mixed.ids[4] == mixed.ids[5] == alone.ids[0]
    # the batch around them differs (padding for the longer rows): log-probs equal up to float rounding
    assert torch.allclose(torch.tensor(mixed.logprobs[:4]), torch.tensor(group.logprobs), atol=1e-5)
