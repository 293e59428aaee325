"""Partial rollouts (rollout.partial=true, rlx/rollout/partial.py): which groups a step trains and in which order,
what is carried (tokens, log-probs, the oldest version), the pool in checkpoints; on a scripted generator whose rows
have fixed lengths, then on the tiny model (oversample 1 is the synchronous producer)."""

import pytest
import torch

from rlx.data.sources import PromptStream
from rlx.engines.records import Generation
from rlx.rewards import RewardComponent
from rlx.rollout.partial import PartialProducer
from rlx.rollout.single_turn import SingleTurnSettings
from tests.loop_fixtures import one_thread  # noqa: F401 (fixture)

EOS = 0


class InOrder(PromptStream):
    """Draws the prompts in their order."""

    def _permutation(self):
        return list(range(len(self.rows)))


class Tokenizer:
    """Prompts are "p<k>"; ids [k]; text of a completion: its length."""

    pad_token_id = EOS
    chat_template = None

    def __call__(self, prompts, add_special_tokens=False):
        return {"input_ids": [[int(p[1:])] for p in prompts]}

    def batch_decode(self, ids, skip_special_tokens=True):
        return [str(int((row != EOS).sum())) for row in ids]


class Scripted:
    """Row (prompt k, seed s) has length LENGTHS[k] + (s % 2): its tokens are 1, 2, ..., then EOS. Rows advance one
    token per call step, all together, stop_when asked after each; records the prefixes it was given."""

    def __init__(self, lengths):
        self.lengths, self.version, self.calls = lengths, 0, []

    def generate_ids(self, prompts, *, max_new_tokens, seeds, continuation, min_new_tokens=0, **_):
        prefixes, stop_when = continuation.prefixes, continuation.stop_when
        self.calls.append([list(p) for p in prefixes])
        targets = [min(self.lengths[p[0]] + s % 2, max_new_tokens) for p, s in zip(prompts, seeds)]
        new = [[] for _ in prompts]
        finished = torch.tensor([False] * len(prompts))
        while not finished.all():
            for i, prefix in enumerate(prefixes):
                if finished[i]:
                    continue
                t = len(prefix) + len(new[i])
                new[i].append(EOS if t + 1 == targets[i] and targets[i] < max_new_tokens else t + 1)
                finished[i] = t + 1 >= targets[i]
            if not finished.all() and stop_when(finished.clone()):
                break
        return Generation(new, [[-0.1 * (self.version + 1)] * len(n) for n in new],
                          [bool(n) and n[-1] == EOS for n in new])


def producer(lengths, prompts_per_step=2, oversample=2.0, group=2, max_new=12, generator=None, rounds=None):
    """A partial producer over prompts p0.. whose rows have `lengths` (Scripted, or `generator`); `rounds`: its
    token-budget rounds (None: none)."""
    rows = [{"prompt": f"p{k}", "answer": "x"} for k in range(len(lengths))]
    stream = InOrder(rows, seed=0)
    generator = generator if generator is not None else Scripted(lengths)
    rewards = [RewardComponent("task", lambda prompts, completions, **_: [float(c) for c in completions], 1.0)]
    settings = SingleTurnSettings(group_size=group, prompts_per_step=prompts_per_step, max_new_tokens=max_new,
                                  min_new_tokens=0, seed=3, use_chat_template=False, system_prompt=None,
                                  on_error="raise", accuracy_key="task", total_steps=10)
    made = PartialProducer(generator, Tokenizer(), stream, rewards, settings, oversample=oversample, rounds=rounds)
    return made, generator


def trained(batch):
    """(prompt k, completion) of every row, in batch order."""
    return [(row["prompt"], ids) for row, ids in zip(batch.source.rows, (r[m.bool()].tolist() for r, m in
                                                                   zip(batch.rollout.completion_ids,
                                                                       batch.rollout.completion_mask)))]


def test_a_step_trains_the_first_finished_groups_in_draw_order_and_carries_the_rest():
    """Prompts p0..p7 with lengths 9, 2, 7, 3, 1, 1, 5, 5 (+1 on odd seeds); 2 groups of 2 per step, 4 in flight.
    Step 1 draws p0..p3; p1 (2-3 tokens) and p3 (3-4) finish while p0 and p2 have 4 tokens: trained [p1, p3] (draw
    order), p0 and p2 carried with their 4 tokens. Step 2 draws p4, p5 (1-2 tokens): they finish first, so [p4, p5]
    is trained while p0 and p2 go on from token 4 to token 6. Step 3 draws p6, p7 (5-6 tokens); p2 needs 1-2 more and
    finishes first, then p0 (3-4 more): trained [p0, p2], in draw order although p2 finished first."""
    made, generator = producer([9, 2, 7, 3, 1, 1, 5, 5])
    first = made.produce(1)
    assert [p for p, _ in trained(first)][::2] == ["p1", "p3"]
    carried = {g.row["prompt"]: g for g in made.pool}
    assert sorted(carried) == ["p0", "p2"] and all(len(ids) == 4 for g in carried.values() for ids in g.ids)
    assert [g.index for g in made.pool] == [0, 2] and made.next_index == 4

    generator.version = 1
    second = made.produce(2)
    assert [p for p, _ in trained(second)][::2] == ["p4", "p5"]
    # the carried rows were continued from exactly their tokens
    assert [len(p) for p in generator.calls[1][:4]] == [4, 4, 4, 4] and generator.calls[1][4:] == [[]] * 4

    generator.version = 2
    third = made.produce(3)
    assert [p for p, _ in trained(third)][::2] == ["p0", "p2"]
    for (prompt, ids), version, logprobs, mask in zip(trained(third), third.rollout.versions, third.rollout.logprobs,
                                                      third.rollout.completion_mask):
        if prompt in ("p0", "p2"):  # begun at step 1 with version 0: the row keeps its oldest version
            assert version == 0 and ids[:4] == [1, 2, 3, 4]
            got = logprobs[mask.bool()].tolist()
            assert got[:4] == pytest.approx([-0.1] * 4)  # each token keeps the log-prob its sampler gave it
    assert third.metrics["rollout/staleness_max"] == 2


def test_the_pool_is_checkpointed():
    """A producer restored from the state after step 1 produces what the uninterrupted one produces."""
    made, generator = producer([9, 2, 7, 3, 1, 1, 5, 5, 2, 8])
    made.produce(1)
    state = {name: obj.state_dict() for name, obj in made.checkpointed().items()}
    want = [trained(made.produce(s)) for s in (2, 3)]
    again, _ = producer([9, 2, 7, 3, 1, 1, 5, 5, 2, 8])
    for name, obj in again.checkpointed().items():
        obj.load_state_dict(state[name])
    assert [trained(again.produce(s)) for s in (2, 3)] == want


def test_nothing_is_generated_when_enough_groups_wait_finished():
    made, generator = producer([1, 1, 1, 1, 6, 6, 6, 6], oversample=2.0)
    made.produce(1)  # all four finish at once (1-2 tokens): two trained, two wait finished
    assert len(made.pool) == 2 and all(all(g.finished) for g in made.pool)
    calls = len(generator.calls)
    batch = made.produce(2)
    assert [p for p, _ in trained(batch)][::2] == ["p2", "p3"]
    assert len(generator.calls) == calls  # no generate call was needed
    assert batch.metrics["rollout/partial_carried_frac"] == 1.0


@pytest.mark.usefixtures("one_thread")
def test_oversample_1_draws_the_synchronous_prompts_and_tokens(tmp_path):
    """oversample 1, nothing carried: the prompts and seeds of the synchronous producer, so the same tokens."""
    from rlx.build import single_turn_producer
    from rlx.config.settings import settings
    from rlx.engines.generator import HFGenerator
    from rlx.loops.common import ProducerParts
    from tests.loop_fixtures import loop_config, rows, tiny_policy

    model, tokenizer = tiny_policy()
    table = {}

    def reward(prompts, completions, **row):
        return [table.setdefault(c, float(len(table) % 2)) for c in completions]

    made = {}
    for label, extra in (("sync", []), ("partial", ["rollout.partial=true", "rollout.partial_oversample=1",
                                                    "rollout.correction=tis"])):
        s = settings(loop_config("prompts_per_step=3", "rollout.samples_per_prompt=4", "rollout.max_new_tokens=12",
                                 *extra))
        parts = ProducerParts(HFGenerator(model, tokenizer, logprobs="sampler"), tokenizer, rows() * 3, [],
                              [RewardComponent("task", reward, 1.0)], tmp_path, None)
        made[label] = single_turn_producer(s, parts)
    assert type(made["partial"]) is PartialProducer
    for step in (1, 2):
        a, b = made["sync"].produce(step), made["partial"].produce(step)
        assert a.rollout.texts == b.rollout.texts and a.source.prompts == b.source.prompts
        assert torch.equal(a.rollout.completion_ids, b.rollout.completion_ids)
        torch.testing.assert_close(a.rollout.logprobs, b.rollout.logprobs, atol=1e-4, rtol=0)


def test_a_group_in_flight_checkpoints_as_plain_data_and_copies_apart():
    """GroupInFlight.state_dict is plain lists and numbers, from_state gives the same group back; a copy's rows grow
    apart from the group's; fresh() is the group as drawn."""
    import pickle

    from rlx.rollout.pool import GroupInFlight

    made, _ = producer([9, 2, 7, 3, 1, 1, 5, 5])
    made.produce(1)
    group = made.pool[0]
    state = pickle.loads(pickle.dumps(group.state_dict()))
    assert all(isinstance(v, (int, str, list, dict, type(None))) for v in state.values())
    assert GroupInFlight.from_state(state) == group and group.ids[0]
    twin = group.copy()
    twin.extend(0, [7], [-0.3], False, 5, 2, 12)
    assert twin.ids[0] == group.ids[0] + [7] and twin.token_versions[0][-1] == 5
    assert GroupInFlight.from_state(state) == group  # the group did not move with its copy
    fresh = group.fresh()
    assert fresh.ids == [[], []] and fresh.versions == [None, None] and fresh.seeds == group.seeds
    assert (fresh.index, fresh.first_step, fresh.marks, fresh.marks_step) == (group.index, None, [], None)
