"""`rlx eval`: benchmark loaders/extractors/verifiers, per-problem metrics, resume, and the command."""

import json
import re
import shutil

import numpy as np
import pytest
from omegaconf import OmegaConf

from rlx.config.overrides import check_overrides
from rlx.config.paths import ASSETS_DIR
from rlx.errors import UserError
from rlx.evaluation.benchmarks import Benchmark, code_completion, qa_problems
from rlx.evaluation.runner import evaluate, read_records
from rlx.evaluation.summary import per_problem_values, summarize
from tests.conftest import only_run_dir, run_rlx


def _benchmark(name, *overrides):
    cfg = check_overrides([f"benchmark={name}", *overrides], config_name="eval")
    return Benchmark(name, OmegaConf.to_container(cfg.benchmark[name], resolve=True))


# --------------------------------------------------------------------------------------------
# Benchmarks
# --------------------------------------------------------------------------------------------


def test_chain_sum_is_the_training_held_out_split():
    from rlx.data.tasks import load_rows

    data = check_overrides([], config_name="train").data
    data.train_size = 50  # the held-out split does not depend on the training size
    _, held_out = load_rows(data, seed=0)
    problems = _benchmark("chain_sum").load()
    assert [p["question"] for p in problems] == [r["question"] for r in held_out]
    assert [p["prompt"] for p in problems] == [r["prompt"] for r in held_out]
    assert [p["answer"] for p in problems] == [r["answer"] for r in held_out]
    # the task's scorer: right answer 1, wrong answer 0, no answer tag 0
    first = problems[:1] * 3
    _, scores = _benchmark("chain_sum").score(
        [f"<answer>{first[0]['answer']}</answer>", "<answer>12345</answer>", first[0]["answer"]], first)
    assert scores == [1.0, 0.0, 0.0]


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_gsm8k_from_a_local_file_in_the_hub_format(tmp_path):
    rows = [
        {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
        {"question": "A shirt costs $1,200 twice. Total?", "answer": "2 * 1200 = 2400\n#### 2,400"},
    ]
    path = _write_jsonl(tmp_path / "gsm8k_test.jsonl", rows)
    bench = _benchmark("gsm8k", f"benchmark.gsm8k.load.path={path}")
    problems = bench.load()
    assert [p["answer"] for p in problems] == ["7", "2,400"]
    assert problems[0]["prompt"].startswith("Tom has 3 apples") and "<answer>" in problems[0]["prompt"]
    completions = ["<answer>7</answer>", "so the total is 2400.", "#### 2400.00", "<answer>8</answer>", "no idea"]
    owners = [problems[0], problems[1], problems[1], problems[0], problems[1]]
    extracted, scores = bench.score(completions, owners)
    assert extracted == ["7", "2400", "2400.00", "8", None]
    assert scores == [1.0, 1.0, 1.0, 0.0, 0.0]


def test_math500_from_a_local_file_with_boxed_answers(tmp_path):
    rows = [{"problem": "Compute 1/2 + 1/4.", "answer": "\\frac{3}{4}", "unique_id": "test/algebra/1.json"},
            {"problem": "Solve x+1=3.", "answer": "2", "unique_id": "test/algebra/2.json"}]
    path = _write_jsonl(tmp_path / "math500.jsonl", rows)
    bench = _benchmark("math500", f"benchmark.math500.load.path={path}")
    problems = bench.load()
    assert [p["id"] for p in problems] == ["test/algebra/1.json", "test/algebra/2.json"]
    completions = ["the sum is \\boxed{\\frac{3}{4}}", "<answer>0.75</answer>", "\\boxed{3}", "<answer>2</answer>"]
    extracted, scores = bench.score(completions, [problems[0], problems[0], problems[1], problems[1]])
    assert extracted == ["\\frac{3}{4}", "0.75", "3", "2"]
    assert scores == [1.0, 1.0, 0.0, 1.0]


def test_missing_file_and_unreachable_hub_say_what_to_do(tmp_path, monkeypatch):
    with pytest.raises(UserError,
                       match=r"benchmark file '.*nope.jsonl' not found; download the test split of openai/gsm8k"):
        _benchmark("gsm8k", f"benchmark.gsm8k.load.path={tmp_path / 'nope.jsonl'}").load()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache: nothing to fall back on
    with pytest.raises(UserError) as info:
        qa_problems("math500", "problem", "answer", "{question}", hub_id="HuggingFaceH4/MATH-500")
    message = str(info.value)
    assert ("cannot load hub dataset 'HuggingFaceH4/MATH-500'" in message
            and "benchmark.math500.load.path=FILE" in message)
    assert "\n" not in message


def test_humaneval_ships_164_problems_and_checks_code_in_the_sandbox():
    bench = _benchmark("humaneval", "benchmark.humaneval.verify={_target_:rlx.tasks.unit_tests,timeout_s:3}")
    problems = bench.load()
    assert len(problems) == 164 and problems[0]["id"] == "HumanEval/0"
    by_id = {p["id"]: p for p in problems}
    close, add = by_id["HumanEval/0"], by_id["HumanEval/53"]  # has_close_elements, add(x, y)
    assert add["entry_point"] == "add"
    correct_close = (
        "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for j, b in enumerate(numbers) if i != "
        "j)\n\ndef unrelated():\n    raise SystemExit(1)\n"  # cut at the stop sequence "\ndef "
    )
    completions = [
        correct_close,
        "    return False\n",                                         # wrong
        "    while True:\n        pass\n",                            # never returns: timeout
        "    return x + y\n",                                         # correct
        "    import os\n    os.kill(os.getppid(), 9)\n",              # hostile: scored as a failure
        "Here you go:\n```python\ndef add(x: int, y: int):\n    return x + y\n```\n",  # chat answer, fenced
        "    return x +\n",                                           # syntax error
    ]
    owners = [close, close, close, add, add, add, add]
    extracted, scores = bench.score(completions, owners)
    assert scores == [1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    assert "unrelated" not in extracted[0] and extracted[0].startswith(close["prompt"])


def test_code_completion_cuts_at_the_first_stop_sequence():
    problem = {"prompt": "def f():\n", "entry_point": "f"}
    text = "    return 1\n\nprint(f())\ndef g(): pass"
    assert code_completion(text, problem, stop=("\ndef ", "\nprint(")) == "def f():\n    return 1\n"


# --------------------------------------------------------------------------------------------
# Metrics from per-problem records
# --------------------------------------------------------------------------------------------


def _record(pid, greedy, scores, extracted):
    return {"id": pid, "greedy": {"score": greedy}, "scores": scores, "extracted": extracted}


def test_per_problem_values_by_hand():
    records = [
        _record("a", 1.0, [1.0, 0.0, 0.0, 1.0], ["3", "5", "5", "3"]),
        _record("b", 0.0, [0.0, 0.0, 0.0, 0.0], ["1", None, "2", "1"]),
    ]
    values = per_problem_values(records, ks=[1, 2, 4, 8], threshold=1.0)
    assert "pass@8" not in values  # k > n = 4 is skipped
    np.testing.assert_allclose(values["greedy/accuracy"], [1.0, 0.0])
    # a: n=4, c=2: pass@1 = 2/4; pass@2 = 1 - C(2,2)/C(4,2) = 1 - 1/6; pass@4 = 1 (n - c < k)
    np.testing.assert_allclose(values["pass@1"], [0.5, 0.0])
    np.testing.assert_allclose(values["pass@2"], [5 / 6, 0.0])
    np.testing.assert_allclose(values["pass@4"], [1.0, 0.0])
    # a: first 2 answers "3","5" tie -> first ("3", correct); first 4: "3" x2 vs "5" x2 tie -> "3" -> 1
    np.testing.assert_allclose(values["maj@2"], [1.0, 0.0])
    np.testing.assert_allclose(values["maj@4"], [1.0, 0.0])
    np.testing.assert_allclose(values["mean@2"], [0.5, 0.0])
    np.testing.assert_allclose(values["mean@4"], [0.5, 0.0])


def test_summarize_pairs_problems_by_id():
    metrics = OmegaConf.create({"ks": [1], "correct_threshold": 1.0, "bootstrap_resamples": 200,
                                "confidence": 0.95, "bootstrap_seed": 0})
    model = [_record(str(i), 1.0 if i < 30 else 0.0, [1.0], ["x"]) for i in range(40)]
    compare = [_record(str(i), 1.0 if i < 10 else 0.0, [0.0], ["y"]) for i in reversed(range(40))]
    out = summarize({"model": model, "compare": compare}, metrics)
    assert out["model"]["greedy/accuracy"]["value"] == pytest.approx(0.75)
    assert out["compare"]["greedy/accuracy"]["value"] == pytest.approx(0.25)
    diff = out["diff"]["greedy/accuracy"]
    assert diff["value"] == pytest.approx(0.5) and 0.3 < diff["low"] < 0.5 < diff["high"] < 0.7
    assert diff["frac_positive"] == 1.0
    # pass@1: 1 vs 0 on every problem, so the paired difference is exactly 1 in every resample
    assert out["diff"]["pass@1"]["low"] == out["diff"]["pass@1"]["high"] == 1.0


# --------------------------------------------------------------------------------------------
# The runner in-process (resume) and the command as a subprocess
# --------------------------------------------------------------------------------------------


def _eval_cfg(*overrides):
    cfg = check_overrides(["limit=6", "sampling.n=2", "metrics.ks=[1,2]", "hardware.num_threads=1",
                           "metrics.bootstrap_resamples=100", "plot=false", *overrides], config_name="eval")
    return cfg


def test_resume_generates_only_the_missing_problems(tmp_path, caplog):
    out = tmp_path / "eval"
    first = evaluate(_eval_cfg(), out, [])
    results = out / "chain_sum" / "model.jsonl"
    lines = results.read_text().splitlines()
    assert len(lines) == 6 and first["benchmarks"]["chain_sum"]["problems"] == {"model": 6}
    # interrupted after 3 problems, in the middle of writing the 4th
    results.write_text("\n".join(lines[:3]) + "\n" + lines[3][:40])
    caplog.set_level("INFO", logger="rlx")
    again = evaluate(_eval_cfg("sampling.n=5", f"resume={out}"), out, [])  # the saved settings win
    assert "3/6 problems already" in caplog.text
    records = read_records(results)
    assert [r["id"] for r in records] == [f"chain_sum/{i}" for i in range(6)]
    assert results.read_text().splitlines()[:3] == lines[:3]  # finished problems were not redone
    assert all(len(r["samples"]) == 2 for r in records)
    assert again["benchmarks"]["chain_sum"]["problems"] == {"model": 6}


@pytest.mark.parametrize("content, needle", [
    (b"\x00\x01garbage", "is damaged ("),
    (b"model:\n  path: builtin:tiny\nsteps: 2\n", "was not written by rlx eval (a training run?)"),
])
def test_resume_of_a_damaged_or_foreign_directory_is_one_line(tmp_path, content, needle):
    from rlx.errors import UserError

    out = tmp_path / "eval"
    out.mkdir()
    (out / "config.yaml").write_bytes(content)
    with pytest.raises(UserError, match=re.escape(needle)):
        evaluate(_eval_cfg(f"resume={out}"), out, [])


def test_eval_run_with_compare_base_and_two_benchmarks(tmp_path):
    # a "training run" whose final model is the shipped tiny model: compared with its base, itself
    run = tmp_path / "outputs" / "train" / "fake_run"
    shutil.copytree(ASSETS_DIR / "tiny", run / "final")
    (run / "config.yaml").write_text("model:\n  path: builtin:tiny\n")
    gsm = _write_jsonl(tmp_path / "gsm.jsonl", [{"question": f"What is {i} + 1?", "answer": f"#### {i + 1}"}
                                                 for i in range(4)])
    result = run_rlx(["eval", f"run={run}", "compare=base", "benchmark=[chain_sum,gsm8k]",
                      f"benchmark.gsm8k.load.path={gsm}",
                      "benchmark.gsm8k.max_new_tokens=8", "limit=8", "sampling.n=4", "hardware.num_threads=1",
                      "metrics.bootstrap_resamples=200"], tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    out = only_run_dir(tmp_path, "eval")
    for name in ("config.yaml", "overrides.yaml", "summary.json", "summary.txt", "plots/pass_at_k.png",
                 "chain_sum/model.jsonl", "chain_sum/compare.jsonl", "gsm8k/model.jsonl", "gsm8k/compare.jsonl"):
        assert (out / name).is_file(), name
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["models"]["model"]["path"] == str(run / "final")
            and summary["models"]["compare"]["path"] == "builtin:tiny")
    chain = summary["benchmarks"]["chain_sum"]
    assert set(chain["model"]) == {"greedy/accuracy", *(f"{m}@{k}" for m in ("pass", "maj", "mean") for k in (1, 2, 4))}
    # the same weights with the same seeds: identical samples, a paired difference of exactly zero
    assert chain["diff"]["greedy/accuracy"] == {"value": 0.0, "low": 0.0, "high": 0.0, "frac_positive": 0.0}
    record = read_records(out / "chain_sum" / "model.jsonl")[0]
    assert set(record) >= {"id", "prompt", "answer", "greedy", "samples", "extracted", "scores"}
    assert len(record["samples"]) == len(record["extracted"]) == len(record["scores"]) == 4
    assert summary["benchmarks"]["gsm8k"]["problems"] == {"model": 4, "compare": 4}
    assert "pass@4" in result.stdout and "difference (paired)" in result.stdout


@pytest.mark.parametrize(
    "overrides,needle",
    [
        (["benchmark=gsmk"], "unknown benchmark 'gsmk' (did you mean 'gsm8k'?)"),
        (["benchmark=[chain_sum,nope]"], "unknown benchmark 'nope'"),
    ],
)
def test_unknown_benchmark_names_the_choices(overrides, needle, capsys):
    with pytest.raises(SystemExit) as info:
        check_overrides(overrides, config_name="eval")
    assert info.value.code == 2 and needle in capsys.readouterr().err


def test_missing_run_or_checkpoint_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="run 'no/such/run' is not a directory"):
        evaluate(_eval_cfg("run=no/such/run"), tmp_path / "a", [])
    (tmp_path / "run" / "checkpoints" / "step_000005").mkdir(parents=True)  # unfinished: never offered as a choice
    step = tmp_path / "run" / "checkpoints" / "step_000010"
    step.mkdir(parents=True)
    (step / "trainer_state.json").write_text("{}")
    (step / "model.safetensors").write_bytes(b"")
    with pytest.raises(UserError, match="has no model 'final'; valid choices: step_000010$"):
        evaluate(_eval_cfg(f"run={tmp_path / 'run'}"), tmp_path / "b", [])
    sharded = tmp_path / "run" / "checkpoints" / "step_000020"  # an FSDP checkpoint: shards, no model
    (sharded / "pytorch_model_fsdp_0").mkdir(parents=True)
    (sharded / "trainer_state.json").write_text("{}")
    with pytest.raises(UserError, match="'step_20' .that checkpoint holds sharded FSDP/DeepSpeed states, not a model.; "
                                        "valid choices: step_000010$"):
        evaluate(_eval_cfg(f"run={tmp_path / 'run'}", "checkpoint=step_20"), tmp_path / "c", [])


def test_missing_benchmark_file_exits_2_with_one_line(tmp_path):
    result = run_rlx(["eval", "benchmark=gsm8k", "benchmark.gsm8k.load.path=missing.jsonl"], tmp_path, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "benchmark file 'missing.jsonl' not found" in lines[0], result.stderr
    assert "download the test split of openai/gsm8k" in lines[0] and "benchmark.gsm8k.load.path=FILE" in lines[0]


@pytest.mark.long
def test_trained_run_beats_its_base_model_with_a_paired_interval(tmp_path):
    # 50 GRPO steps lift held-out greedy accuracy on chain_sum well above the shipped model's
    train = run_rlx(["train", "steps=50", "eval.every=50", "hardware.num_threads=1", "save.plot=false"], tmp_path,
                    timeout=1200)
    assert train.returncode == 0, train.stderr[-3000:]
    run = only_run_dir(tmp_path, "train")
    result = run_rlx(["eval", f"run={run}", "compare=base", "hardware.num_threads=1"], tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((only_run_dir(tmp_path, "eval") / "summary.json").read_text())
    diff = summary["benchmarks"]["chain_sum"]["diff"]["greedy/accuracy"]
    assert diff["low"] > 0, diff


def test_benchmark_sampling_through_the_generator_protocol_draws_what_generate_drew(tmp_path):
    """run_benchmark samples through the generator protocol; its greedy and sampled completions must be exactly
    those of the former path: rlx.engines.hf.generate on the rendered prompts, seeds drawn by generate from the
    torch RNG seeded per batch (greedy call first, then the sampled one)."""
    import torch

    from rlx.engines.hf import generate
    from rlx.evaluation.runner import EvalPass, _batch_seed, _model_inputs, run_benchmark
    from rlx.models.loading import load_causal_lm, load_tokenizer

    tok, model = load_tokenizer("builtin:tiny"), load_causal_lm("builtin:tiny")
    bench = _benchmark("chain_sum")
    problems = bench.load(5)
    sampling = OmegaConf.create({"n": 3, "greedy": True, "max_new_tokens": 12, "temperature": 0.8, "top_p": 0.95,
                                 "top_k": 0, "batch_size": 8})  # 2 problems (8 rows) per batch: 3 batches
    records = run_benchmark(model, tok, bench, problems,
                            EvalPass(tmp_path / "model.jsonl", sampling, chat_template=True,
                                                                  seed=3, label="chain_sum", progress=False))
    for start in range(0, 5, 2):
        batch = problems[start : start + 2]
        inputs = _model_inputs(tok, batch, True, bench.system_prompt)
        torch.manual_seed(_batch_seed(3, batch[0]["id"]))
        greedy = generate(model, tok, inputs, samples_per_prompt=1, max_new_tokens=12, greedy=True, batch_size=8)
        sampled = generate(model, tok, inputs, samples_per_prompt=3, max_new_tokens=12, temperature=0.8, top_p=0.95,
                           top_k=0, batch_size=8)
        for i, record in enumerate(records[start : start + 2]):
            assert record["greedy"]["completion"] == greedy.texts[i]
            assert record["samples"] == sampled.texts[3 * i : 3 * i + 3]
            assert record["truncated"] == int(sampled.truncated[3 * i : 3 * i + 3].sum())
    assert len({s for r in records for s in r["samples"]}) > 5  # really sampled, not all alike


def _saved_run(tmp_path, config_yaml: str):
    """A training run folder: the tiny model as its final/ and `config_yaml` as its config.yaml."""
    run = tmp_path / "run"
    shutil.copytree(ASSETS_DIR / "tiny", run / "final")
    (run / "config.yaml").write_text(config_yaml)
    return run


@pytest.mark.parametrize("given, want",
                         [([], 0.7), (["sampling.temperature=1.0"], 1.0), (["rollout.temperature=1.0"], 1.0)])
def test_eval_of_a_run_samples_at_the_runs_temperature(tmp_path, given, want):
    # a real model's preset trains at 0.7 (conf/tuning): eval.yaml's 1.0 would score samples the run never drew
    run = _saved_run(tmp_path, "model:\n  path: builtin:tiny\nrollout:\n  temperature: 0.7\n  top_p: 0.9\n  top_k: 5\n")
    out = tmp_path / "eval"
    evaluate(_eval_cfg(f"run={run}", "limit=2", "sampling.n=1", *given), out, [f"run={run}", *given])
    sampling = OmegaConf.load(out / "config.yaml").sampling
    assert (sampling.temperature, sampling.top_p, sampling.top_k) == (want, 0.9, 5)


@pytest.mark.parametrize("given, want_reader", [([], "final_number"), (["model.answer.reader=tag"], "tag")])
def test_eval_of_a_run_asks_and_reads_answers_as_the_runs_model_preset(tmp_path, given, want_reader):
    # a SmolLM2 run is asked the bare question and read by final_number; eval.yaml's default model asks for tags
    run = _saved_run(tmp_path, "model:\n  path: builtin:tiny\n  answer:\n    prompt: bare\n    reader: final_number\n")
    out = tmp_path / "eval"
    overrides = [f"run={run}", "benchmark=chain_sum", "limit=2", "sampling.n=1", *given]
    evaluate(_eval_cfg(*overrides), out, overrides)
    config = OmegaConf.load(out / "config.yaml")
    assert config.model.answer.reader == want_reader
    prompts = [r["prompt"] for r in read_records(out / "chain_sum" / "model.jsonl")]
    assert all(("<answer>" in p) == (want_reader == "tag") for p in prompts)
    assert json.loads((out / "summary.json").read_text())["benchmarks"]["chain_sum"]["reader"] == want_reader
