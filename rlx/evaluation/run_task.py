"""What `rlx eval run=<run>` evaluates when no benchmark is named: the task the run trained on (or, for an agent run,
the environment it played: `run_environment`, `with_run_subject`).

A run's config.yaml holds its data settings, so the benchmark is rebuilt from them: the held-out rows of its
data (reasoning-gym: the same held-out split `rlx train` evaluates, named after the data, so the default run
still reports `chain_sum`; a file or hub dataset: the rows `rlx train` held out), scored like the run's own
eval/accuracy: by the data's verifier when the run's accuracy component is the task verifier, else by that
reward component itself (a reward function given to `rlx.fit` is found while the same Python process lives).
Benchmarks outside the package: `rlx eval benchmark=./mine.yaml` (a file with one or more `name: {load: ...,
verifier: ..., max_new_tokens: ...}` entries, as in conf/benchmark/) goes to `benchmark_files`.
"""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import OmegaConf

from rlx.errors import UserError

log = logging.getLogger("rlx")

# reward targets that score with the data's verifier (rlx/rewards/rule.py): the run's eval/accuracy is the verifier's
VERIFIER_REWARDS = {"rlx.rewards.rule.task_score": None, "rlx.rewards.rule.exact_match": "exact",
                    "rlx.rewards.rule.math_equivalence": "math"}
TASK_SOURCES = ("reasoning_gym", "file", "hub")


def run_config(run: str):
    """The training run's config.yaml (None when the folder has none)."""
    path = Path(run).expanduser() / "config.yaml"
    if not path.is_file():
        return None
    try:
        return OmegaConf.load(path)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(f"run={run}: {path} is damaged ({first})") from None


def run_task_benchmark(run: str) -> tuple[str, dict] | None:
    """(name, benchmark config) of the task a training run trained on, or None when its data is no task (an
    agent run, data.source none): the caller keeps the configured benchmarks then."""
    config = run_config(run)
    if config is None or config.get("data") is None or config.data.get("source") not in TASK_SOURCES:
        return None
    data = OmegaConf.to_container(config.data, resolve=True)
    spec = {"load": {"_target_": "rlx.evaluation.run_task.held_out_problems", "data": data, "seed": int(config.seed)},
            "data": None, "verifier": None, "reader": OmegaConf.select(config, "model.answer.reader", default=None),
            "extract": None, "verify": None,
            "max_new_tokens": int(config.eval.max_new_tokens), "chat_template": bool(config.model.chat_template),
            "system_prompt": data.get("system_prompt")}
    component, target = _accuracy_component(config)
    if component is not None and target not in VERIFIER_REWARDS and not _importable(target):
        if (data.get("columns") or {}).get("answer", "answer") is None:
            raise UserError(f"run={run} was scored by reward '{component}' ({target}), which cannot be imported here "
                            "(a reward function given to rlx.fit exists only in that Python process: call "
                            "rlx.evaluate there), and its data has no answer column for a verifier; name a benchmark: "
                            "benchmark=...")
        log.warning("run=%s was scored by reward '%s' (%s), which cannot be imported here: scoring with the data's "
                    "verifier instead, so the numbers need not match the run's eval/accuracy", run, component, target)
        component = None
    if target in VERIFIER_REWARDS or component is None:
        spec["verifier"] = data.get("verifier") or VERIFIER_REWARDS.get(target) or (
            "reasoning_gym" if data["source"] == "reasoning_gym" else "exact")
        how = f"verifier {spec['verifier']}"
    else:
        reward = {k: v for k, v in OmegaConf.to_container(config.reward.components[component], resolve=True).items()
                  if k != "weight"}
        spec["extract"] = {"_target_": "rlx.evaluation.run_task.whole_completion"}
        spec["verify"] = {"_target_": "rlx.evaluation.run_task.reward_scores", "name": component, "reward": reward}
        how = f"reward {component} ({target}), the run's eval/accuracy"
    name = task_name(data)
    log.info("run=%s trained on data=%s: evaluating its held-out rows, scored by %s (benchmark=... evaluates "
             "benchmarks instead)", run, name, how)
    return name, spec


SAMPLING_KNOBS = ("temperature", "top_p", "top_k")


def run_sampling(run: str, overrides: list[str]) -> dict:
    """The run's own sampling knobs (its rollout.temperature, top_p, top_k), for those the command line leaves
    unset (sampling.KNOB= or rollout.KNOB=): sampled metrics (pass@k, maj@k) then measure the distribution the run
    drew from, as its training reward did. eval.yaml's defaults are the tiny model's (temperature 1.0); a real
    model's preset samples cooler (model=smollm2-135m-instruct: 0.7, where its samples are coherent)."""
    config = run_config(run)
    if config is None or config.get("rollout") is None:
        return {}
    given = {o.lstrip("+~").partition("=")[0] for o in overrides}
    rollout = OmegaConf.to_container(config.rollout, resolve=True)
    return {knob: rollout[knob] for knob in SAMPLING_KNOBS
            if rollout.get(knob) is not None and not {f"sampling.{knob}", f"rollout.{knob}"} & given}


def run_answer(run: str, overrides: list[str]) -> dict | None:
    """The run's own answer format (its model preset's model.answer: how the question is asked, which reader finds
    the answer), unless the command line names model= or model.answer: `rlx eval run=<a SmolLM2 run>
    benchmark=gsm8k` then asks and reads as the run was trained, not as eval.yaml's default model would."""
    config = run_config(run)
    given = {o.lstrip("+~").partition("=")[0] for o in overrides}
    if config is None or config.get("model") is None or config.model.get("answer") is None:
        return None
    if given & {"model", "model.answer"} or any(g.startswith("model.answer.") for g in given):
        return None
    return OmegaConf.to_container(config.model.answer, resolve=True)


def _importable(target: str) -> bool:
    from hydra.utils import get_method

    try:
        get_method(target)
    except Exception:
        return False
    return True


def task_name(data: dict) -> str:
    """The benchmark's name: the data's name (chain_sum, gcd, ...); for a file the file's stem (its folder's name
    for a train.jsonl, as rlx.fit(dataset=...) writes <run>/dataset/train.jsonl), for a hub dataset its id."""
    if data["source"] == "file" and data.get("name") in (None, "file"):
        path = Path(str(data["train_path"]))
        return path.stem if path.stem != "train" else path.parent.name
    if data["source"] == "hub" and data.get("name") in (None, "hub"):
        return str(data["id"]).rstrip("/").rpartition("/")[2]
    return str(data.get("name") or data["source"])


def _accuracy_component(config) -> tuple[str | None, str | None]:
    reward = config.get("reward")
    if reward is None or reward.get("accuracy") not in (reward.get("components") or {}):
        return None, None
    name = str(reward.accuracy)
    return name, str(reward.components[name].get("_target_"))


def held_out_problems(data: dict, seed: int, size: int | None = None) -> list[dict]:
    """The held-out rows of a training data config, as benchmark problems: reasoning-gym data through the
    chain_sum benchmark's loader (same ids and prompts as before), files and hub datasets through the training
    loader (rlx.data.tasks.load_rows: the same split `rlx train` held out)."""
    from rlx.evaluation.benchmarks import reasoning_gym_problems

    if data["source"] == "reasoning_gym":
        return reasoning_gym_problems(data, size)
    from rlx.data.tasks import load_rows

    _, rows = load_rows(OmegaConf.create(data), seed)
    name = data.get("name") or data["source"]
    return [{**row, "id": str(row.get("id", f"{name}/{index}")), "answer": row.get("answer")}
            for index, row in enumerate(rows[:size] if size else rows)]


def whole_completion(completion: str, problem: dict) -> str:
    """The extractor of a reward-scored benchmark: the reward reads the whole completion."""
    return completion


def reward_scores(extracted: list[str], problems: list[dict], *, name: str, reward: dict) -> list[float]:
    """Scores of the run's accuracy reward component on whole completions (TRL's contract through
    rlx.rewards.compute_rewards; None counts 0, as in the run's eval/accuracy)."""
    import torch

    from rlx.rewards import build_rewards, compute_rewards

    try:
        components = build_rewards(OmegaConf.create({"components": {name: dict(reward)}, "accuracy": name}))
    except UserError:
        raise UserError(f"the run's reward '{name}' ({reward.get('_target_')}) cannot be imported here; a reward "
                        f"function given to rlx.fit exists only in that Python process (call rlx.evaluate there), "
                        f"else name a benchmark: benchmark=...") from None
    rows = [{k: v for k, v in p.items() if k not in ("id",)} for p in problems]
    _, per_component, _ = compute_rewards(components, [p.get("prompt") for p in problems], extracted, rows)
    return torch.nan_to_num(per_component[name], nan=0.0).tolist()


# ------------------------------------------------------------------------------------------------
# benchmark files outside the package: rlx eval benchmark=./mine.yaml
# ------------------------------------------------------------------------------------------------


def _is_file_choice(value: str) -> bool:
    return value.endswith((".yaml", ".yml"))


def benchmark_file_args(args: list[str]) -> list[str]:
    """`benchmark=./mine.yaml` or `benchmark=[chain_sum,./mine.yaml]` -> the package's benchmarks stay in
    `benchmark=[...]`, the files go to `benchmark_files=[...]` (absolute paths; a missing file is one line)."""
    out = []
    for arg in args:
        key, sep, value = arg.partition("=")
        if key != "benchmark" or not sep:
            out.append(arg)
            continue
        items = [v.strip() for v in value.strip().removeprefix("[").removesuffix("]").split(",") if v.strip()]
        files = [v for v in items if _is_file_choice(v)]
        if not files:
            out.append(arg)
            continue
        missing = [f for f in files if not Path(f).expanduser().is_file()]
        if missing:
            raise UserError(f"benchmark file '{missing[0]}' not found (run from the folder it is in, or give its path)")
        kept = [v for v in items if v not in files]
        out.append(f"benchmark=[{','.join(kept)}]")
        out.append("benchmark_files=[" + ",".join(f"'{Path(f).expanduser().resolve()}'" for f in files) + "]")
    return out


BENCHMARK_DEFAULTS = {"data": None, "verifier": None, "reader": None, "extract": None, "verify": None,
                      "chat_template": None, "system_prompt": None}


def load_benchmark_files(paths: list[str]) -> dict[str, dict]:
    """name -> benchmark config from each YAML file (the format of conf/benchmark/<name>.yaml without its
    defaults list); optional keys default to null. Each needs `load` and `max_new_tokens`."""
    benchmarks: dict[str, dict] = {}
    for path in paths:
        try:
            loaded = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise UserError(f"benchmark file {path}: not YAML ({first})") from None
        if not isinstance(loaded, dict) or not loaded:
            raise UserError(f"benchmark file {path}: expected `name: {{load: ..., verifier: ..., max_new_tokens: "
                            "...}`")
        for name, spec in loaded.items():
            if name == "defaults":
                continue
            if not isinstance(spec, dict):
                raise UserError(f"benchmark file {path}: '{name}' is not a mapping of load, verifier, max_new_tokens")
            missing = [k for k in ("load", "max_new_tokens") if k not in spec]
            if missing:
                raise UserError(f"benchmark file {path}: '{name}' has no '{missing[0]}'")
            if name in benchmarks:
                raise UserError(f"benchmark '{name}' is defined twice ({path})")
            benchmarks[str(name)] = {**BENCHMARK_DEFAULTS, **spec}
    return benchmarks


def run_environment(run: str):
    """The `env` config a training run played (its config.yaml), or None (not an agent run). The run's plugins
    are imported first: an environment one of them registered is then found by its name."""
    saved = Path(run).expanduser() / "config.yaml"
    if not saved.is_file():
        return None
    config = OmegaConf.load(saved)
    env = config.get("env")
    if env:
        from rlx.config.plugins import import_plugins

        import_plugins(config.get("plugins"))
        log.info("run=%s trained on env=%s: evaluating held-out episodes of it (benchmark=... evaluates benchmarks)",
                 run, env.name)
    return env or None


def with_run_subject(s):
    """run=RUN without benchmark=: an agent run's own environment (its config.yaml's env), else a task run's
    held-out rows of its own data, scored like its eval/accuracy (run_task_benchmark). `s`: rlx eval's typed settings
    (an EvalConfig), returned with its env or benchmark replaced."""
    import dataclasses

    from rlx.config.groups import Env
    from rlx.config.settings import build

    env = run_environment(s.run)
    if env:
        return dataclasses.replace(s, env=build(Env, OmegaConf.to_container(env, resolve=True)))
    own = run_task_benchmark(s.run)
    return dataclasses.replace(s, benchmark={own[0]: own[1]}) if own is not None else s
