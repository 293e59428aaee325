"""Multi-turn rollouts (rlx/rollout/env.py): token-in/token-out, loss masks, limits, faulty environments."""

import pytest
import torch

from rlx.engines.generator import HFGenerator
from rlx.engines.records import Generation, Rollout
from rlx.envs.builtin import Grid
from rlx.models.loading import load_causal_lm, load_tokenizer
from rlx.rollout.env import ChatFormat, EpisodeLimits, TurnDecoding, run_episodes


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("builtin:tiny", None, False)


class Scripted:
    """A generator that 'samples' fixed token ids (one list per turn, the same for every row)."""

    version = 0

    def __init__(self, turns, stop=True):
        self.turns, self.stop, self.calls = turns, stop, 0

    def generate_ids(self, prompts, *, max_new_tokens, seeds, greedy=False):
        ids = self.turns[min(self.calls, len(self.turns) - 1)][:max_new_tokens]
        self.calls += 1
        return Generation([list(ids) for _ in prompts], [[-0.5] * len(ids) for _ in prompts],
                          [self.stop] * len(prompts))


class Echo:
    """Never terminates; answers every action with the same text."""

    def reset(self, *, seed=None, options=None):
        return "start", {"anchor": 0}

    def step(self, action):
        return "again", 0.0, False, False, {"anchor": 0}


class Raises(Echo):
    def step(self, action):
        raise RuntimeError("env crashed")


class BadReward(Echo):
    def step(self, action):
        return "fine", float("nan"), False, False, {}


class WordReward(Echo):
    def step(self, action):
        return "fine", "1", False, False, {}


class Done(Echo):
    def step(self, action):
        return "bye", 1.0, True, False, {"metrics": {"success": 1.0}, "is_action_valid": action == "higher"}


def test_token_in_token_out_keeps_sampled_ids_that_retokenizing_would_change(tokenizer):
    sampled = [tokenizer.convert_tokens_to_ids(t) for t in ["h", "i", "g", "h", "e", "r"]] + [tokenizer.eos_token_id]
    text = tokenizer.decode(sampled, skip_special_tokens=True)
    assert text == "higher"
    retokenized = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert retokenized != sampled[:-1]  # the tokenizer merges "er": re-encoding would train other ids
    episodes = run_episodes(Scripted([sampled]), tokenizer, [Echo(), Done()], [0, 1], [0, 1], EpisodeLimits(2, 16, 200))
    for e in episodes:
        for start, end in e.turn_spans:
            assert e.ids[start:end] == sampled and all(e.loss_mask[start:end])
        assert e.actions[0] == "higher"
    echo, done = episodes
    # Echo: turn, answer ("again", loss 0), turn; then max_turns -> truncated
    assert len(echo.turn_spans) == 2 and echo.truncated and not echo.terminated
    answer = ChatFormat(tokenizer).answer_ids("again")
    between = echo.ids[echo.turn_spans[0][1]:echo.turn_spans[1][0]]
    assert between == answer and sum(echo.loss_mask) == 2 * len(sampled)
    assert tokenizer.decode(echo.prompt_ids + echo.ids) == (
        "<|im_start|>user\nstart<|im_end|>\n<|im_start|>assistant\nhigher<|im_end|>\n"
        "<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\nhigher<|im_end|>")
    assert done.terminated and not done.truncated and done.step_rewards == [1.0] and done.valid == [True]
    assert done.success == 1.0 and echo.anchors == [0, 0]


def test_faulty_environments_lose_only_their_own_episode(tokenizer):
    ids = tokenizer("R", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    envs = [Raises(), Echo(), Done(), BadReward(), WordReward()]
    episodes = run_episodes(Scripted([ids]), tokenizer, envs, [0, 1, 2, 3, 4], [0, 1, 2, 3, 4],
                            EpisodeLimits(3, 8, 200))
    raised, echo, done, nan_reward, word_reward = episodes
    for bad in (nan_reward, word_reward):  # a reward that is not a finite number ends only its episode, marked
        assert bad.truncated and "not a finite number" in bad.error and bad.step_rewards == [0.0]
    assert raised.truncated and "env crashed" in raised.error
    assert echo.error is None and echo.truncated and len(echo.turn_spans) == 3  # never terminates: cut at max_turns
    assert done.error is None and done.terminated and done.step_rewards == [1.0]

    class BadReset(Echo):
        def reset(self, *, seed=None, options=None):
            raise OSError("no board")

    bad, good = run_episodes(Scripted([ids]), tokenizer, [BadReset(), Done()], [0, 1], [0, 1], EpisodeLimits(1, 8, 200))
    assert bad.truncated and "reset" in bad.error and good.terminated
    # an observation that is not text is not bad luck but the environment's code: the run stops
    # (tests/test_bad_input.py)


def test_turn_and_total_budgets_truncate_and_mark(tokenizer):
    long_turn = tokenizer("abcdefgh", add_special_tokens=False)["input_ids"]  # no stop token
    (e,) = run_episodes(Scripted([long_turn], stop=False), tokenizer, [Echo()], [0], [0], EpisodeLimits(3, 4, 1000))
    assert e.turn_truncated == 3 and all(end - start == 4 for start, end in e.turn_spans)
    assert e.ids[e.turn_spans[0][1]] == tokenizer.eos_token_id and e.loss_mask[e.turn_spans[0][1]] == 0
    (e,) = run_episodes(Scripted([long_turn], stop=False), tokenizer, [Echo()], [0], [0], EpisodeLimits(10, 4, 40))
    assert e.truncated and len(e.prompt_ids) + sum(e.loss_mask) <= 40 and len(e.turn_spans) < 10


def test_rollout_batch_masks(tokenizer):
    ids = tokenizer("R", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    episodes = run_episodes(Scripted([ids]), tokenizer, [Echo(), Done()], [0, 1], [0, 1], EpisodeLimits(2, 8, 200))
    batch = Rollout.from_episodes(episodes, tokenizer.pad_token_id)
    assert batch.loss_mask.sum(dim=1).tolist() == [2 * len(ids), len(ids)]
    assert (batch.loss_mask <= batch.completion_mask).all()
    assert batch.completion_mask.sum(dim=1).tolist() == [len(e.ids) for e in episodes]
    assert batch.step_index[0][batch.loss_mask[0].bool()].tolist() == [0] * len(ids) + [1] * len(ids)
    assert (batch.step_index[batch.loss_mask == 0] == -1).all()
    assert batch.truncated.tolist() == [True, False]
    assert torch.allclose(batch.logprobs[batch.loss_mask.bool()], torch.tensor(-0.5))


class Recording(HFGenerator):
    def generate_ids(self, prompts, **kwargs):
        out = super().generate_ids(prompts, **kwargs)
        self.seen = getattr(self, "seen", []) + [out]
        return out


def test_hf_generator_ids_are_exactly_what_the_model_sampled(tokenizer):
    torch.manual_seed(0)
    model = load_causal_lm("builtin:tiny", "float32", None, False)
    generator = Recording(model, tokenizer, temperature=1.0)
    episodes = run_episodes(generator, tokenizer, [Grid(), Grid()], [3, 3], [5, 6], EpisodeLimits(3, 6, 240))
    sampled_turns = {0: [], 1: []}
    for out in generator.seen:
        live = [i for i in (0, 1) if len(sampled_turns[i]) < len(episodes[i].turn_spans)]
        for row, i in enumerate(live):
            sampled_turns[i].append((out.ids[row], out.logprobs[row]))
    for i, e in enumerate(episodes):
        for (start, end), (ids, logprobs) in zip(e.turn_spans, sampled_turns[i]):
            assert e.ids[start:end] == ids and e.logprobs[start:end] == logprobs
    # the sampler log-probs equal the policy's log-probs of the trained tokens (temperature 1)
    from rlx.models.forward import completion_logprobs
    batch = Rollout.from_episodes(episodes, tokenizer.pad_token_id)
    logp, _ = completion_logprobs(model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                                  batch.completion_mask)
    mask = batch.loss_mask.bool()
    assert torch.allclose(logp[mask], batch.logprobs[mask], atol=1e-4)


def test_tool_output_is_context_not_loss(tokenizer):
    from rlx.envs.tools import ToolUse

    env = ToolUse()
    env.reset(seed=5)
    expression, answer = env.expression, env.answer
    turns = [tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
             for text in (f"<calc>{expression}</calc>", f"<answer>{answer}</answer>")]
    (e,) = run_episodes(Scripted(turns), tokenizer, [ToolUse()], [5], [0], EpisodeLimits(3, 32, 240))
    assert e.terminated and e.step_rewards == [0.0, 1.0] and e.observations[1] == f"<result>{answer}</result>"
    trained = tokenizer.decode([i for i, m in zip(e.ids, e.loss_mask) if m])
    context = tokenizer.decode([i for i, m in zip(e.ids, e.loss_mask) if not m])
    assert "<result>" not in trained and f"<result>{answer}</result>" in context
    assert f"<calc>{expression}</calc>" in trained and f"<answer>{answer}</answer>" in trained


def test_play_closes_cut_turns_with_the_stop_ids_of_a_generator_without_a_model(tokenizer):
    """The vLLM engine has no `.model`; play() takes its stop_ids, so a turn cut at its token budget is closed
    with the engine's stop token (loss mask 0) exactly as with HFGenerator (whose stop ids come from the model's
    generation config, which may differ from the tokenizer's eos: here the stop id is not the tokenizer's)."""
    from omegaconf import OmegaConf

    from rlx.evaluation.agents import play

    generator = Scripted([tokenizer("higher lower", add_special_tokens=False)["input_ids"]], stop=False)
    stop = tokenizer.eos_token_id + 1  # any id other than the tokenizer's eos
    generator.stop_ids = [stop]
    env_cfg = OmegaConf.create({"max_turns": 2, "max_new_tokens": 2, "max_total_tokens": 240, "system_prompt": None})
    (episode,) = play(generator, tokenizer, Echo, env_cfg, [0], [1], TurnDecoding(greedy=False))
    start, end = episode.turn_spans[0]
    assert episode.turn_truncated == 2
    assert episode.ids[end] == stop and episode.loss_mask[end] == 0
