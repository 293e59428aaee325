import json

import pytest
from omegaconf import OmegaConf

from rlx.data.sources import PromptStream
from rlx.data.tasks import load_rows
from rlx.errors import UserError


def _cfg(**kw):
    base = dict(source="reasoning_gym", task="chain_sum",
                task_config=dict(min_terms=2, max_terms=3, min_digits=1, max_digits=1),
                train_size=3000, eval_size=200, eval_seed=10007, prompt_template="Q: {question}", system_prompt=None)
    base.update(kw)
    return OmegaConf.create(base)


def test_reasoning_gym_split_is_held_out_and_deterministic():
    train, evals = load_rows(_cfg(), seed=0)
    assert len(evals) == 200
    assert not {r["question"] for r in train} & {r["question"] for r in evals}
    assert train[0]["prompt"].startswith("Q: ")
    again, _ = load_rows(_cfg(), seed=0)
    assert [r["question"] for r in again[:50]] == [r["question"] for r in train[:50]]


def test_file_rows_column_mapping_and_errors(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps({"q": f"question {i % 30}", "a": str(i)}) for i in range(60)))
    cfg = OmegaConf.create(dict(source="file", train_path=str(path), eval_path=None, eval_size=10,
                                columns={"prompt": "q", "answer": "a"}, seed=0, prompt_template="{question}"))
    train, evals = load_rows(cfg, seed=0)
    assert len(evals) == 10
    assert not {r["question"] for r in train} & {r["question"] for r in evals}
    bad = OmegaConf.merge(cfg, {"columns": {"prompt": "missing"}})
    with pytest.raises(UserError, match="no column 'missing'"):
        load_rows(bad, seed=0)
    with pytest.raises(UserError, match="not found"):
        load_rows(OmegaConf.merge(cfg, {"train_path": str(tmp_path / "nope.jsonl")}), seed=0)


def test_prompt_stream_state_roundtrip():
    rows = [{"i": i} for i in range(5)]
    a = PromptStream(rows, seed=3)
    first = a.take(7)
    assert sorted(r["i"] for r in first[:5]) == list(range(5))  # one full epoch before repeating
    state = a.state_dict()
    b = PromptStream(rows, seed=3)
    b.load_state_dict(state)
    assert a.take(6) == b.take(6)


def test_several_reasoning_gym_tasks_mix_in_one_run_each_scored_by_its_own_task():
    """data.task=[gcd,leg_counting]: rows of both tasks, alternating, held out apart, each row's task kept
    so the reasoning_gym verifier scores it with that task's scorer; per-task options by name."""
    from rlx.tasks import reasoning_gym_score

    cfg = _cfg(task=["gcd", "leg_counting"], task_config={"gcd": {"max_value": 50}}, train_size=60, eval_size=10)
    train, evals = load_rows(cfg, seed=0)
    assert [r["task"] for r in evals] == ["gcd", "leg_counting"] * 5
    assert {r["task"] for r in train} == {"gcd", "leg_counting"} and 50 <= len(train) <= 60
    assert not {r["question"] for r in train} & {r["question"] for r in evals}
    gcd_numbers = [int(n) for r in train if r["task"] == "gcd" for n in json.loads(r["metadata"])["numbers"]]
    assert max(gcd_numbers) <= 50  # the gcd options reached gcd
    assert reasoning_gym_score([r["answer"] for r in evals], evals) == [1.0] * 10
    assert all(score < 1.0 for score in reasoning_gym_score([str(int(r["answer"]) + 1) for r in evals], evals))
    with pytest.raises(UserError, match="'max_value' is not one of"):
        load_rows(_cfg(task=["gcd", "leg_counting"], task_config={"max_value": 50}), seed=0)
    with pytest.raises(UserError, match="unknown reasoning-gym task 'gcdd'"):
        load_rows(_cfg(task=["gcdd", "leg_counting"], task_config=None), seed=0)
