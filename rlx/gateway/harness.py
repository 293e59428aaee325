"""The harness contract: `env=harness env.target=my_module.run` trains an agent program written against the
OpenAI client, unchanged.

    def run(task, base_url, api_key, **env.kwargs) -> float | dict     # or `async def run(...)`
        client = OpenAI(base_url=base_url, api_key=api_key)
        ... client.chat.completions.create(model="anything", messages=..., tools=...) in a loop ...
        return reward                 # or {"reward": R, "success": 0/1, "rewards": [per call], "anchors": [per call]}

One call of run() is one episode (one gateway session; base_url names it, api_key is the run's token).
`task` is the environment seed (an int), or a row of env.tasks / env.eval_tasks (a .jsonl or .json file).
The dict form: "reward" the episode's return (a finite number); "rewards" optional, one reward per model
call in call order (then "reward" may be left out, it is their sum; when both are given they must agree);
"success" optional (0..1, else reward > 0 counts as success); "anchors" optional, one hashable state key per
model call (GiGPO's step groups; lists are made tuples); "valid" optional, one true/false per model call
(false: an invalid action, algorithm.invalid_penalty and env/invalid_actions); "truncated" optional, true
when the harness cut the episode itself (a step limit: algorithm.mask_truncated leaves it out of the loss).
Without "rewards" the return is the last call's reward.

env.concurrency episodes run at once, each within env.timeout_s. An episode whose run() raises, runs past its
timeout, returns anything else (a string, NaN, None, a bool) or never calls the model is kept as a marked
episode: error set, truncated, reward 0, its tokens kept (mask_truncated leaves them out of the loss), and
counted in env/errors; the batch goes on. Only when every episode of a batch fails (none by timeout) does
the run stop, with one line naming the first error. A message whose content is not text (an int, a dict, an
image part) is refused with HTTP 400 and, after the batch, stops the run with one line naming the session
(HarnessError): a mistake in the harness's code, not one episode's bad luck. A synchronous run() runs in a
daemon thread; past its timeout it is abandoned (its session is closed, so its next model call gets HTTP 410).
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import itertools
import json
import logging
import math
import threading
import traceback
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

from rlx.errors import UserError
from rlx.gateway.server import Gateway, GatewayError, GatewaySettings
from rlx.rollout.env import TurnDecoding, generator_stop_ids

log = logging.getLogger("rlx")
RESULT_KEYS = ("reward", "rewards", "success", "anchors", "valid", "truncated")
_PLAYS = itertools.count()  # session ids stay unique across the calls of one process


class HarnessError(UserError):
    """A harness that cannot be used (one line for the user, exit code 2)."""


def load_harness(target):
    """env.target -> the run function; checks that it takes (task, base_url, api_key)."""
    if callable(target):
        fn = target
    else:
        module_name, _, attr = str(target or "").rpartition(".")
        if not module_name:
            raise HarnessError(f"env.target='{target}' must name a function such as my_module.run (env=harness)")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise HarnessError(f"env.target='{target}': cannot import {module_name} ({exc}); is it on "
                               "PYTHONPATH?") from None
        fn = getattr(module, attr, None)
        if fn is None:
            raise HarnessError(f"env.target='{target}': module {module_name} has no attribute {attr}")
        if not callable(fn):
            raise HarnessError(f"env.target='{target}' is a {type(fn).__name__}, not a function run(task, base_url, "
                               "api_key)")
    try:
        inspect.signature(fn).bind("task", "base_url", "api_key")
    except TypeError:
        raise HarnessError(f"env.target={getattr(fn, '__qualname__', fn)} must accept (task, base_url, api_key), its "
                           f"signature is {inspect.signature(fn)}") from None
    except ValueError:  # no signature (a builtin): try it
        pass
    return fn


@dataclass
class HarnessSettings:
    concurrency: int = 8
    timeout_s: float = 300.0
    kwargs: dict = field(default_factory=dict)
    gateway: GatewaySettings = field(default_factory=GatewaySettings)
    host: str = "127.0.0.1"
    allow_remote: bool = False
    tasks: list | None = None          # rows of env.tasks (None: the task is the seed)
    eval_tasks: list | None = None     # rows of env.eval_tasks (held-out seeds read these)
    version: int = 0                   # the policy version recorded when this call starts its own gateway
    stop_ids: list[int] | None = None  # the tokens that end a model turn (None: the gateway's own)

    @classmethod
    def from_env(cls, env_cfg, *, greedy: bool, version: int = 0, stop_ids: list[int] | None = None) -> HarnessSettings:
        """The env=harness config group read and checked (HarnessError naming the knob)."""
        from rlx.gateway.server import is_loopback

        if not is_loopback(str(env_cfg.host)) and not env_cfg.allow_remote:
            raise HarnessError(f"env.host={env_cfg.host} is not a loopback address: anyone who can reach it and knows "
                               "the token drives the model; set env.allow_remote=true to mean it")
        template = getattr(env_cfg, "chat_template", None)
        if template:
            path = Path(str(template)).expanduser()
            if not path.is_file():
                raise HarnessError(f"env.chat_template={template} is not a file (a Jinja chat template)")
            template = path.read_text()
        gateway = GatewaySettings(max_turns=int(env_cfg.max_turns), max_new_tokens=int(env_cfg.max_new_tokens),
                                  max_total_tokens=int(env_cfg.max_total_tokens), max_batch=int(env_cfg.max_batch),
                                  max_wait_ms=float(env_cfg.max_wait_ms),
                                  tool_parser=getattr(env_cfg, "tool_parser", None),
                                  chat_template=template or None, system_prompt=getattr(env_cfg, "system_prompt", None),
                                  greedy=greedy)
        kwargs = dict(getattr(env_cfg, "kwargs", None) or {})
        return cls(int(env_cfg.concurrency), float(env_cfg.timeout_s), _plain(kwargs), gateway, str(env_cfg.host),
                   bool(env_cfg.allow_remote), read_tasks(getattr(env_cfg, "tasks", None)),
                   read_tasks(getattr(env_cfg, "eval_tasks", None)), version, stop_ids)


def _plain(value):
    from omegaconf import DictConfig, ListConfig, OmegaConf

    return OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value


@functools.lru_cache(maxsize=8)
def _rows(path: str, mtime: float) -> tuple:
    text = Path(path).read_text()
    try:
        rows = (json.loads(text) if path.endswith(".json")
                else [json.loads(line) for line in text.splitlines() if line.strip()])
    except json.JSONDecodeError as exc:
        raise HarnessError(f"{path} is not valid JSON{' lines' if not path.endswith('.json') else ''}: {exc}") from None
    if not isinstance(rows, list) or not rows:
        raise HarnessError(f"{path} holds no task rows (a JSON list, or one JSON value per line)")
    return tuple(rows)


def read_tasks(path) -> list | None:
    if not path:
        return None
    file = Path(str(path)).expanduser()
    if not file.is_file():
        raise HarnessError(f"task file {path} does not exist (env.tasks / env.eval_tasks: .jsonl or .json)")
    return list(_rows(str(file), file.stat().st_mtime))


def tasks_for(seeds: list[int], settings: HarnessSettings) -> list:
    """The task of each seed: the seed itself, or a row of the task files (held-out seeds, those at or above
    EVAL_SEED_BASE, read eval_tasks when given: held-out task k is row k)."""
    from rlx.rollout.env import EVAL_SEED_BASE

    out = []
    for seed in seeds:
        if seed >= EVAL_SEED_BASE and settings.eval_tasks:
            out.append(settings.eval_tasks[(seed - EVAL_SEED_BASE) % len(settings.eval_tasks)])
        elif settings.tasks:
            out.append(settings.tasks[seed % len(settings.tasks)])
        else:
            out.append(seed)
    return out


@dataclass
class Outcome:
    """What one run() gave, checked."""

    reward: float = 0.0
    rewards: list[float] | None = None
    success: float | None = None
    anchors: list | None = None
    valid: list[bool] | None = None
    truncated: bool = False
    error: str | None = None
    timed_out: bool = False


def _number(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
        raise ValueError(f"{what} is {value!r} ({type(value).__name__}), not a finite number")
    return float(value)


def _hashable(key):
    if isinstance(key, list):
        return tuple(_hashable(k) for k in key)
    if isinstance(key, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in key.items()))
    hash(key)
    return key


def read_result(result, calls: int) -> Outcome:
    """run()'s return value -> Outcome; ValueError (naming the fix) for anything else."""
    if not isinstance(result, dict):
        return Outcome(reward=_number(result, "run() returned a reward that"))
    unknown = sorted(set(result) - set(RESULT_KEYS))
    if unknown:
        raise ValueError(f"run() returned unknown keys {unknown}; valid keys: {', '.join(RESULT_KEYS)}")
    rewards = None
    if result.get("rewards") is not None:
        if not isinstance(result["rewards"], (list, tuple)) or len(result["rewards"]) != calls:
            raise ValueError(f"run() returned 'rewards' {result['rewards']!r}: one reward per model call is needed "
                             f"({calls} calls)")
        rewards = [_number(r, "a per-call reward") for r in result["rewards"]]
    if "reward" in result:
        reward = _number(result["reward"], "'reward'")
        if rewards is not None and abs(sum(rewards) - reward) > 1e-6 * max(1.0, abs(reward)):
            raise ValueError(f"run() returned reward {reward} but its per-call rewards sum to {sum(rewards)}; give "
                             "one, or make them agree")
    elif rewards is not None:
        reward = sum(rewards)
    else:
        raise ValueError("run() returned a dict without 'reward' (or 'rewards')")
    success = result.get("success")
    success = (None if success is None else float(success) if isinstance(success, bool)
               else _number(success, "'success'"))
    anchors = result.get("anchors")
    if anchors is not None:
        if not isinstance(anchors, (list, tuple)) or len(anchors) != calls:
            raise ValueError("run() returned 'anchors' with "
                             f"{len(anchors) if isinstance(anchors, (list, tuple)) else '?'} entries; one per model "
                             f"call is needed ({calls} calls)")
        try:
            anchors = [_hashable(a) for a in anchors]
        except TypeError as exc:
            raise ValueError(f"an anchor is not hashable: {exc}") from None
    valid = result.get("valid")
    if valid is not None and (not isinstance(valid, (list, tuple)) or len(valid) != calls
                              or not all(isinstance(v, bool) for v in valid)):
        raise ValueError(f"run() returned 'valid' {valid!r}: one true/false per model call is needed ({calls} calls)")
    truncated = result.get("truncated", False)
    if not isinstance(truncated, bool):
        raise ValueError(f"run() returned 'truncated' {truncated!r}, not true/false")
    return Outcome(reward=reward, rewards=rewards, success=success, anchors=anchors,
                   valid=list(valid) if valid is not None else None, truncated=truncated)


def _in_daemon_thread(fn, args, kwargs) -> Future:
    """fn(*args) in a daemon thread (a harness stuck past its timeout cannot hold the process open)."""
    future: Future = Future()

    def target():
        if not future.set_running_or_notify_cancel():
            return
        try:
            out = fn(*args, **kwargs)
            if inspect.isawaitable(out):
                out = asyncio.run(_awaited(out))
            future.set_result(out)
        except BaseException as exc:  # noqa: BLE001 - SystemExit from a harness must not end the trainer
            future.set_exception(exc if isinstance(exc, Exception) else RuntimeError(f"{type(exc).__name__}: {exc}"))

    threading.Thread(target=target, name="rlx-harness", daemon=True).start()
    return future


async def _awaited(awaitable):
    return await awaitable


def run_sessions(fn, args: list[tuple], *, concurrency: int, timeout_s: float, kwargs: dict,
                 before=None, after=None) -> list[tuple[object, str | None, bool, str | None]]:
    """fn(*args[i], **kwargs) for every i, `concurrency` at a time, each within timeout_s.
    Returns (result, error, timed_out, traceback) per i. before(i) / after(i) bracket each run."""
    is_async = inspect.iscoroutinefunction(fn)

    async def main():
        gate = asyncio.Semaphore(max(1, concurrency))

        async def one(i):
            async with gate:
                if before is not None:
                    before(i)
                try:
                    job = (fn(*args[i], **kwargs) if is_async
                           else asyncio.wrap_future(_in_daemon_thread(fn, args[i], kwargs)))
                    task = asyncio.ensure_future(job)
                    done, _ = await asyncio.wait({task}, timeout=timeout_s)
                    if not done:
                        task.cancel()
                        return None, f"timeout: the harness ran past env.timeout_s={timeout_s:g}s", True, None
                    return task.result(), None, False, None
                except Exception as exc:
                    return None, f"{type(exc).__name__}: {exc}", False, traceback.format_exc()
                finally:
                    if after is not None:
                        after(i)

        return await asyncio.gather(*(one(i) for i in range(len(args))))

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())
    box: list = []  # called from inside an event loop (a notebook): run ours in a thread
    thread = threading.Thread(target=lambda: box.append(asyncio.run(main())), daemon=True)
    thread.start()
    thread.join()
    return box[0]


def play_harness(generator, tokenizer, target, tasks: list | None, seeds: list[int], sample_seeds: list[int],
                 settings: HarnessSettings, *, gateway: Gateway | None = None) -> list:
    """One episode per seed: run(task, base_url, api_key) against a gateway on `generator` (the one given, or
    one started for this call with settings.version and settings.stop_ids); returns one Episode per session, in input
    order, the same record rlx.evaluation.agents.play returns (fork rows in Episode.forks: rlx/gateway/episodes.py)."""
    from rlx.gateway.episodes import session_episode

    fn = load_harness(target)
    for name in ("httpx", "httpx2", "openai"):  # the harness's client would log every request at INFO
        if logging.getLogger(name).level == logging.NOTSET:
            logging.getLogger(name).setLevel(logging.WARNING)
    tasks = tasks_for(seeds, settings) if tasks is None else list(tasks)
    if not (len(tasks) == len(seeds) == len(sample_seeds)):
        raise ValueError(f"{len(tasks)} tasks, {len(seeds)} seeds and {len(sample_seeds)} sample seeds")
    own = gateway is None
    if own:
        try:
            gateway = Gateway(generator, tokenizer, settings.gateway, stop_ids=settings.stop_ids, host=settings.host,
                              allow_remote=settings.allow_remote)
        except GatewayError as exc:
            raise HarnessError(str(exc)) from None
        gateway.version = settings.version
        gateway.start()
    play = next(_PLAYS)
    sids = [f"p{play}-{i}" for i in range(len(seeds))]
    sessions = {}
    try:
        def before(i):
            sessions[i] = gateway.open_session(sids[i], sample_seeds[i])

        outcomes = run_sessions(fn, [(task, gateway.base_url(sid), gateway.token) for task, sid in zip(tasks, sids)],
                                concurrency=settings.concurrency, timeout_s=settings.timeout_s, kwargs=settings.kwargs,
                                before=before, after=lambda i: gateway.close_session(sids[i]))
    finally:
        if own:
            gateway.stop()
    not_text = next((i for i in sorted(sessions) if sessions[i].not_text), None)
    if not_text is not None:  # a mistake in the harness's code, not bad luck: every episode would hit it
        name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)}"
        raise HarnessError(f"harness env.target={name} showed the model an observation that is not text (session "
                           f"{sids[not_text]}: {sessions[not_text].not_text}); send each message's content as a str "
                           "(or a list of text parts), and a /v1/completions prompt as a str")
    episodes, failures = [], []
    for i, (result, error, timed_out, trace) in enumerate(outcomes):
        session = sessions[i]
        if error is None:
            try:
                outcome = read_result(result, len(session.calls))
            except ValueError as exc:
                outcome = Outcome(error=f"bad return value: {exc}")
        else:
            outcome = Outcome(error=error, timed_out=timed_out)
        if outcome.error is not None and session.cut and not timed_out and trace is not None:
            outcome = Outcome(error=None)  # it raised on the refusal of a call past a limit: a cut episode
        if outcome.error is None and not session.calls:
            outcome = Outcome(error="the harness never called the model (no token was sampled for this episode)"
                              if not session.cut else f"the first call was refused ({session.cut})")
        if outcome.error is not None:
            failures.append((sids[i], outcome, trace))
        episodes.append(session_episode(session, outcome, tokenizer))
    _report(failures, episodes)
    return episodes


def _report(failures: list, episodes: list) -> None:
    forks = sum(len(e.forks) for e in episodes)
    if forks:
        log.info("harness: %d fork rows in %d episodes (the harness rewrote, trimmed or repeated its history)",
                 forks, len(episodes))
    if not failures:
        return
    sid, first, trace = failures[0]
    log.warning("harness: %d of %d episodes failed (marked, reward 0); first, session %s: %s%s", len(failures),
                len(episodes), sid, first.error, f"\n{trace}" if trace else "")
    if len(failures) == len(episodes) and not any(o.timed_out for _, o, _ in failures):
        raise HarnessError(f"every one of the {len(episodes)} harness episodes failed; the first: {first.error}")


def harness_player(env):
    """A `play` for env=harness (the signature of rlx.rollout.env.play): each episode is one session of the user's
    program `env.target` against a gateway on the run's generator, the policy version the generator's."""

    def play(generator, tokenizer, factory, limits, env_seeds: list[int], sample_seeds: list[int],
             decoding: TurnDecoding) -> list:
        stop_ids = decoding.stop_ids if decoding.stop_ids is not None else generator_stop_ids(generator, tokenizer)
        settings = HarnessSettings.from_env(env, greedy=decoding.greedy, version=generator.version,
                                            stop_ids=stop_ids)
        return play_harness(generator, tokenizer, env.target, None, env_seeds, sample_seeds, settings)

    return play
