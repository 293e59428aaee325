"""Drive a batch of text environments turn by turn, token in, token out.

For every episode the conversation is kept as token ids: the first prompt (chat template around the
first observation), then each model turn exactly as sampled (never decoded and re-encoded: a merge
the tokenizer would make differently cannot change what is trained), then the environment's answer
encoded as its own tokens with loss mask 0, ending in the template's generation prompt. All live
episodes generate together, one turn at a time.

Limits: `max_turns` model turns; `max_new_tokens` per turn (a turn that hits it is closed with the
stop token, loss mask 0, and counted in Episode.turn_truncated); `max_total_tokens` for the whole
sequence, prompt included (the model's position limit). An episode cut by any limit or by the
environment's own truncation is marked `truncated` (the loop can leave it out of the loss, as DAPO
does with overlong samples). An environment that raises, or returns a non-numeric reward, ends its own episode
as truncated with `error` set; the other episodes go on. One that hands back something other than text as an
observation (reset or step) is a mistake in its code, not bad luck: the run stops at once with one line
(`observation_text`, UserError, exit code 2), in training, agent SFT, evaluation and the start-up probe alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from rlx.engines.generator import Generator
from rlx.engines.hf import eos_ids
from rlx.engines.records import Episode
from rlx.engines.sampling import sample_seed
from rlx.errors import UserError

_PLACEHOLDER_USER, _PLACEHOLDER_ASSISTANT = "\x01U\x01", "\x01A\x01"
TURN_STRIDE = 1000003  # turn t of the episode with sample seed s samples with seed s * TURN_STRIDE + t
EVAL_SEED_BASE = 2**31  # held-out environment seeds start here; training seeds stay below


@dataclass(frozen=True)
class EpisodeLimits:
    """The limits of an episode and its system prompt, as the `env` settings hold them (run_episodes reads these four
    attributes: the env settings themselves do as well): `max_turns` model turns, `max_new_tokens` per turn,
    `max_total_tokens` for the whole sequence, prompt included."""

    max_turns: int
    max_new_tokens: int
    max_total_tokens: int
    system_prompt: str | None = None


@dataclass(frozen=True)
class TurnDecoding:
    """How the model's turns are decoded: greedily or sampled, the first prompt in the tokenizer's chat template or
    as plain text, and the token ids that end a turn (None: run_episodes takes the tokenizer's end token; play the
    generator's own, a vLLM engine's stop_ids or HFGenerator's model's)."""

    greedy: bool = False
    use_chat_template: bool = True
    stop_ids: list[int] | None = None


def train_env_seed(seed: int, step: int, task: int) -> int:
    """Environment seed of task `task` at training step `step` (below EVAL_SEED_BASE)."""
    return sample_seed(seed ^ 0x5EED, step, task) & (EVAL_SEED_BASE - 1)


class ChatFormat:
    """Token ids of the first prompt and of each environment answer, from the tokenizer's chat template
    (or plain text when there is none). The answer's text is what the template puts between the end of
    an assistant message (after the stop token the model sampled) and the next generation prompt."""

    def __init__(self, tokenizer, system_prompt: str | None = None, use_chat_template: bool = True):
        self.tokenizer, self.system_prompt = tokenizer, system_prompt
        self.templated = bool(use_chat_template and getattr(tokenizer, "chat_template", None))
        self.stop_text = tokenizer.eos_token or ""
        if self.templated:
            head = self._messages(_PLACEHOLDER_USER) + [{"role": "assistant", "content": _PLACEHOLDER_ASSISTANT}]
            base = tokenizer.apply_chat_template(head, tokenize=False)
            full = tokenizer.apply_chat_template(head + [{"role": "user", "content": _PLACEHOLDER_USER}],
                                                 tokenize=False, add_generation_prompt=True)
            if not full.startswith(base):
                raise ValueError("the chat template rewrites earlier turns; multi-turn rollouts need an append-only "
                                 "template")
            after = base[base.rindex(_PLACEHOLDER_ASSISTANT) + len(_PLACEHOLDER_ASSISTANT):]
            closing = after[len(self.stop_text):] if self.stop_text and after.startswith(self.stop_text) else after
            self.answer_template = closing + full[len(base):]
        else:
            self.answer_template = "\n" + _PLACEHOLDER_USER + "\n"

    def _messages(self, observation: str) -> list[dict]:
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return system + [{"role": "user", "content": observation}]

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def prompt_ids(self, observation: str) -> list[int]:
        if self.templated:
            text = self.tokenizer.apply_chat_template(self._messages(observation), tokenize=False,
                                                      add_generation_prompt=True)
        else:
            text = (f"{self.system_prompt}\n\n" if self.system_prompt else "") + observation + "\n"
        return self.encode(text)

    def answer_ids(self, observation: str) -> list[int]:
        return self.encode(self.answer_template.replace(_PLACEHOLDER_USER, observation))


def _environment(env) -> str:
    kind = type(env)
    return f"{kind.__module__}.{kind.__qualname__}"


def _a(name: str) -> str:
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def observation_text(observation, env, call: str) -> str:
    """The one check that an environment's observation is text: UserError (one line, exit code 2) naming the
    environment, the call ('reset' or 'step'), the type it returned and what to return instead."""
    if isinstance(observation, str):
        return observation
    shown = repr(observation)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    shape = "(observation, info)" if call == "reset" else "(observation, reward, terminated, truncated, info)"
    raise UserError(f"environment {_environment(env)}: {call}() returned {_a(type(observation).__name__)} observation "
                    f"({shown}), not text; {call}() must return {shape} with the observation a str (the text the "
                    f"model reads, e.g. str(obs) or a rendering of it)")


def checked_reset(env, seed: int):
    """env.reset(seed=seed) -> (observation: str, info: dict); a return value that is not (observation, info) or
    whose observation is not text is a UserError (observation_text). An exception inside reset propagates."""
    out = env.reset(seed=seed)
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        what = "None" if out is None else f"{_a(type(out).__name__)} ({repr(out)[:40]})"
        raise UserError(f"environment {_environment(env)}: reset() returned {what} instead of (observation, info); "
                        f"return a pair (observation: str, info: dict)")
    obs, info = out
    return observation_text(obs, env, "reset"), info if isinstance(info, dict) else {}


def _checked_step(env, action: str):
    """env.step with the return value checked; raises ValueError naming what is wrong (UserError for an observation
    that is not text: observation_text)."""
    out = env.step(action)
    if not isinstance(out, tuple) or len(out) != 5:
        raise ValueError("step() must return (observation, reward, terminated, truncated, info), got "
                         f"{type(out).__name__}")
    obs, reward, terminated, truncated, info = out
    observation_text(obs, env, "step")
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(float(reward)):
        raise ValueError(f"step() returned reward {reward!r}, not a finite number")
    return obs, float(reward), bool(terminated), bool(truncated), info if isinstance(info, dict) else {}


def _reset_episodes(envs: list, env_seeds: list[int], fmt: ChatFormat) -> tuple[list[Episode], dict]:
    """Each env reset with its seed: the episodes (an environment that fails to reset ends its episode only, with
    its error) and, by episode index, the first turn's state key (info["anchor"])."""
    episodes: list[Episode] = []
    next_anchor = {}
    for index, (env, seed) in enumerate(zip(envs, env_seeds)):
        try:
            obs, info = checked_reset(env, seed)
            episode = Episode(prompt_ids=fmt.prompt_ids(obs), observations=[obs])
            next_anchor[index] = info.get("anchor")
        except UserError:  # the environment's code hands back the wrong thing, in every episode alike
            raise
        except Exception as exc:  # the environment's fault: this episode only
            episode = Episode(prompt_ids=[], truncated=True, error=f"reset: {type(exc).__name__}: {exc}")
        episodes.append(episode)
    return episodes, next_anchor


def _append_turn(e: Episode, ids: list[int], logprobs: list[float], stopped: bool, anchor, stop_ids: list[int]) -> None:
    """The sampled turn `ids` joins episode `e` (trained tokens, their log-probs, its span and state key); a turn
    that hit its budget without a stop token is closed with stop_ids[0], not trained."""
    start = len(e.ids)
    e.ids += ids
    e.loss_mask += [1] * len(ids)
    e.logprobs += logprobs
    e.turn_spans.append((start, len(e.ids)))
    e.anchors.append(anchor)
    if not stopped:  # the turn hit its budget: close it with the stop token, not trained
        e.turn_truncated += 1
        if stop_ids:
            e.ids.append(stop_ids[0])
            e.loss_mask.append(0)
            e.logprobs.append(0.0)


def run_episodes(generator: Generator, tokenizer, envs: list, env_seeds: list[int], sample_seeds: list[int],
                 limits: EpisodeLimits, decoding: TurnDecoding = TurnDecoding()) -> list[Episode]:
    """Play one episode in each env (reset with env_seeds[i]); returns the episodes in input order. limits: the
    episode's limits and system prompt (EpisodeLimits, or the `env` settings); decoding: TurnDecoding.

    sample_seeds[i] seeds the sampling of episode i (its turn t uses sample_seeds[i] * TURN_STRIDE + t), so
    an episode does not depend on which other episodes share its batch."""
    max_turns, max_new_tokens, max_total_tokens = limits.max_turns, limits.max_new_tokens, limits.max_total_tokens
    greedy, stop_ids = decoding.greedy, decoding.stop_ids
    fmt = ChatFormat(tokenizer, limits.system_prompt, decoding.use_chat_template)
    stop_ids = stop_ids if stop_ids is not None else [tokenizer.eos_token_id]
    episodes, next_anchor = _reset_episodes(envs, env_seeds, fmt)
    turn_end = {}  # by episode index: where its last turn ends
    live = [i for i, e in enumerate(episodes) if e.error is None]
    for turn in range(max_turns):
        budgets = {i: min(max_new_tokens, max_total_tokens - len(episodes[i].prompt_ids) - len(episodes[i].ids))
                   for i in live}
        for i in [i for i in live if budgets[i] < 1]:
            episodes[i].truncated = episodes[i].budget_cut = True  # no room left for another turn
        live = [i for i in live if budgets[i] >= 1]
        if not live:
            break
        contexts = [episodes[i].prompt_ids + episodes[i].ids for i in live]
        out = generator.generate_ids(contexts, max_new_tokens=max(budgets[i] for i in live),
                                     seeds=[sample_seeds[i] * TURN_STRIDE + turn for i in live], greedy=greedy)
        still = []
        for row, i in enumerate(live):
            e = episodes[i]
            ids, stopped = out.ids[row][: budgets[i]], out.stopped[row]
            logprobs = out.logprobs[row][: budgets[i]] if out.logprobs is not None else [0.0] * len(ids)
            stopped = stopped and len(ids) == len(out.ids[row])
            _append_turn(e, ids, logprobs, stopped, next_anchor[i], stop_ids)
            turn_end[i] = len(e.ids)
            action = tokenizer.decode(ids, skip_special_tokens=True)
            e.actions.append(action)
            try:
                obs, reward, terminated, truncated, info = _checked_step(envs[i], action)
            except UserError:
                raise
            except Exception as exc:
                e.step_rewards.append(0.0)
                e.valid.append(False)
                e.truncated, e.error = True, f"step: {type(exc).__name__}: {exc}"
                continue
            e.step_rewards.append(reward)
            e.valid.append(bool(info.get("is_action_valid", True)))
            e.metrics = dict(info.get("metrics") or e.metrics)
            next_anchor[i] = info.get("anchor")
            if terminated or truncated:
                e.terminated, e.truncated = terminated, truncated and not terminated
                continue
            e.observations.append(obs)
            answer = fmt.answer_ids(obs)
            e.ids += answer
            e.loss_mask += [0] * len(answer)
            e.logprobs += [0.0] * len(answer)
            still.append(i)
        live = still
    for i in live:  # max_turns reached without the environment ending the episode
        episodes[i].truncated = True
    for i, e in enumerate(episodes):  # an answer after the last turn was never read by the model: drop it
        end = turn_end.get(i, len(e.ids))
        e.ids, e.loss_mask, e.logprobs = e.ids[:end], e.loss_mask[:end], e.logprobs[:end]
    return episodes


def generator_stop_ids(generator, tokenizer) -> list[int] | None:
    """The token ids that end a turn of `generator`: the vLLM engine carries its stop ids; HFGenerator's come from its
    model."""
    return (getattr(generator, "stop_ids", None) if not hasattr(generator, "model")
            else eos_ids(generator.model, tokenizer))


def play(generator, tokenizer, factory, limits, env_seeds: list[int], sample_seeds: list[int],
         decoding: TurnDecoding) -> list[Episode]:
    """One episode in a fresh environment (factory()) per seed; limits: the `env` settings (max_turns,
    max_new_tokens, max_total_tokens, system_prompt); decoding: greedy or sampled, the chat template, the stop ids
    (None: the generator's own)."""
    envs = [factory() for _ in env_seeds]
    if decoding.stop_ids is None:
        decoding = replace(decoding, stop_ids=generator_stop_ids(generator, tokenizer))
    return run_episodes(generator, tokenizer, envs, env_seeds, sample_seeds, limits, decoding)
