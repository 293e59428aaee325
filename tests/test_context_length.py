"""Prompts longer than the model's context stop the run before training, in one line (issue 17)."""

import json

import pytest

from rlx.errors import UserError
from rlx.models.loading import load_causal_lm, load_tokenizer
from rlx.rollout.prompt_limits import check_context, model_context
from tests.conftest import run_rlx

TINY = "builtin:tiny"


@pytest.fixture(scope="module")
def tiny():
    return load_causal_lm(TINY, "float32"), load_tokenizer(TINY)


def test_context_is_read_from_the_model_config(tiny):
    model, _ = tiny
    assert model_context(model) == model.config.max_position_embeddings == 256


def test_a_prompt_past_the_context_names_its_row_and_the_fix(tiny):
    model, tokenizer = tiny
    rows = [{"prompt": "1 + 1 =", "answer": "2"}, {"prompt": "1 +" * 300, "answer": "x"}]
    with pytest.raises(UserError) as info:
        check_context(tokenizer, rows, model_context(model), 16, False, None, "data.train_path=d.jsonl (training)")
    message = str(info.value)
    assert "d.jsonl (training) row 1" in message and "data.max_prompt_length=240" in message and "\n" not in message
    # the same rows fit when the completion budget does not matter: only the long one is over
    check_context(tokenizer, rows[:1], model_context(model), 16, False, None, "x")


def test_the_completion_budget_counts_too(tiny):
    model, tokenizer = tiny
    rows = [{"prompt": "1 +" * 60, "answer": "x"}]
    check_context(tokenizer, rows, 256, 16, False, None, "x")  # fits with a short budget
    with pytest.raises(UserError, match="exceeds the model's context"):
        check_context(tokenizer, rows, 256, 200, False, None, "x")
    with pytest.raises(UserError, match="leaves no room for a prompt"):
        check_context(tokenizer, rows, 256, 256, False, None, "x")


def test_rlx_train_stops_in_one_line(tmp_path):
    data = tmp_path / "long.jsonl"
    rows = [{"prompt": f"{i} + 1 =", "answer": str(i + 1)} for i in range(12)]
    rows[5]["prompt"] = "1 + " * 400 + "1 ="
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = run_rlx(["train", "data=file", f"data.train_path={data}", "data.eval_path=null", "data.eval_size=2",
                      "steps=1"], tmp_path, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    error = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "exceeds the model's context" in error[0] and "long.jsonl" in error[0]
    assert "Traceback" not in result.stderr
