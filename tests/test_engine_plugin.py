"""An engine of the user's (rlx.register("engine", NAME), rollout.engine=NAME; examples/transformers_engine.py):
rlx samples through it, the trainer corrects with its log-probs, the rules read what it declares it gives, and
a backend it cannot replace is refused in one line."""

import json

import pytest
import torch

from rlx.cli.training import check_run
from rlx.config.overrides import check_overrides
from rlx.errors import UserError
from tests.conftest import run_rlx
from tests.test_producer_plugin import QUIET

PLUGIN = ["plugins=[examples.transformers_engine]", "rollout.engine=transformers_generate"]


def test_an_engine_of_ones_own_samples_the_run(tmp_path):
    """Two steps through the example engine: every step calls it (its own metric), and its log-probs are the
    behaviour policy's the trainer compares with its own (the gap is small: the same weights, another decoder)."""
    result = run_rlx(["train", *PLUGIN, *QUIET, "steps=2", "prompts_per_step=2", "rollout.samples_per_prompt=2",
                      "rollout.max_new_tokens=8", "rollout.correction=tis", "name=own"], tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "built: generator rollout=hf (TransformersGenerate)" in result.stderr + result.stdout
    (run,) = (tmp_path / "outputs" / "train").glob("*_own")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [row["rollout/engine_calls"] for row in rows] == [1.0, 1.0]
    assert all(abs(row["rollout/logprob_gap_mean"]) < 1e-3 for row in rows)


def test_what_an_engine_does_not_give_is_refused_in_one_line():
    check_run(check_overrides(PLUGIN))  # plain sampling: accepted
    for extra, message in ((["rollout.partial=true", "rollout.correction=tis"],
                            "rollout.partial=true continues unfinished rows from their tokens, which "
                            "rollout.engine=transformers_generate"),
                           (["rollout.quantize=int8"], "which rollout.engine=transformers_generate does not run"),
                           (["rollout=vllm"], "rollout.engine=transformers_generate samples in the training process "
                                              "in place of rollout=hf's decoder")):
        with pytest.raises(UserError, match=message) as info:
            check_run(check_overrides([*PLUGIN, *extra]))
        assert "\n" not in str(info.value)
    with pytest.raises(UserError, match=r"unknown rollout.engine 'nope'; valid choices: builtin, .*transformers_gen"):
        check_run(check_overrides([PLUGIN[0], "rollout.engine=nope"]))


def test_a_publisher_of_ones_own_writes_what_it_chose_and_reloads_every_server(fakes, tmp_path):
    """examples/bf16_publisher.py through rollout.server.publisher=bf16_file on two fake servers: a publish writes
    the served weights in bfloat16 (the update's values, rounded), then every server reloads that folder."""
    from safetensors.torch import load_file

    import examples.bf16_publisher  # noqa: F401  (registers bf16_file)
    from rlx.models.loading import load_causal_lm, load_tokenizer
    from tests.test_server_unit import build

    model, tok = load_causal_lm("builtin:tiny"), load_tokenizer("builtin:tiny")
    a, b = fakes(), fakes()
    gen = build([a.url, b.url], model, tok, tmp_path, publisher="bf16_file")
    try:
        with torch.no_grad():
            model.model.embed_tokens.weight.add_(1.0)  # an "update"
        gen.sync_weights(model, version=3)
        weights = load_file(tmp_path / "work" / "model" / "model.safetensors")
        assert {t.dtype for t in weights.values()} == {torch.bfloat16}
        assert torch.equal(weights["model.embed_tokens.weight"], model.model.embed_tokens.weight.to(torch.bfloat16))
        for fake in (a, b):
            reloads = [body for path, body in fake.requests if path == "/collective_rpc"]
            assert reloads[-1]["kwargs"]["weights_path"] == str(tmp_path / "work" / "model")
            assert fake.version == "3"
    finally:
        gen.close()
