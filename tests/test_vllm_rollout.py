"""rollout=vllm: a clear error without a GPU; on a GPU with vLLM installed, seeded and weight-synced generation."""

import importlib.util

import pytest
import torch
from omegaconf import OmegaConf

from rlx.config import CONF_DIR, UserError

HAS_VLLM_GPU = torch.cuda.is_available() and importlib.util.find_spec("vllm") is not None


def _rollout_cfg():
    hf = OmegaConf.load(CONF_DIR / "rollout" / "hf.yaml")
    vllm = OmegaConf.load(CONF_DIR / "rollout" / "vllm.yaml")
    vllm.pop("defaults")
    return OmegaConf.merge(hf, vllm)


def test_vllm_config_and_errors():
    from rlx.rollout.vllm import build_engine

    cfg = _rollout_cfg()
    assert cfg.backend == "vllm" and cfg.samples_per_prompt == 8  # the hf sampling settings carry over
    assert build_engine(OmegaConf.create({"backend": "hf"}), None, None, 0) is None
    with pytest.raises(UserError, match="valid choices: hf, vllm"):
        build_engine(OmegaConf.create({"backend": "vlm"}), None, None, 0)
    if not HAS_VLLM_GPU:
        from rlx.models.loading import load_causal_lm, load_tokenizer

        with pytest.raises(UserError, match="rollout=hf"):
            build_engine(cfg, load_causal_lm("builtin:tiny"), load_tokenizer("builtin:tiny"), 0)


@pytest.mark.skipif(not HAS_VLLM_GPU, reason="needs a CUDA GPU and `pip install 'rlx[vllm]'`")
def test_vllm_generates_seeded_and_follows_weight_updates():
    from rlx.models.loading import load_causal_lm, load_tokenizer
    from rlx.rollout.sampling import sample_seed
    from rlx.rollout.vllm import build_engine

    tok, model = load_tokenizer("builtin:tiny"), load_causal_lm("builtin:tiny")
    cfg = _rollout_cfg()
    cfg.gpu_memory_utilization = 0.2
    engine = build_engine(cfg, model, tok, 0)
    prompts = [tok.apply_chat_template([{"role": "user", "content": f"Compute {a} + 3"}], tokenize=False,
                                       add_generation_prompt=True) for a in range(3)]
    seeds = [sample_seed(0, 1, i) for i in range(6)]
    first = engine.generate(prompts, samples_per_prompt=2, max_new_tokens=12, seeds=seeds)
    again = engine.generate(prompts, samples_per_prompt=2, max_new_tokens=12, seeds=seeds)
    assert first.texts == again.texts and first.completion_ids.shape[0] == 6
    shard = engine.generate(prompts[1:2], samples_per_prompt=2, max_new_tokens=12, seeds=seeds[2:4])
    assert shard.texts == first.texts[2:4]  # completion i depends only on seeds[i]
    greedy = engine.generate(prompts, samples_per_prompt=1, max_new_tokens=12, greedy=True)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.0)  # an all-zero model predicts the uniform distribution: greedy output must change
    engine.sync_weights(model)
    assert engine.generate(prompts, samples_per_prompt=1, max_new_tokens=12, greedy=True).texts != greedy.texts
