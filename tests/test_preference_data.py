"""Preference data: both layouts, malformed rows (error naming the row, or skipped and counted),
truncation modes, the held-out split, and pairing of sampled completions."""

import json

import pytest
from omegaconf import OmegaConf

from rlx.config.paths import ASSETS_DIR
from rlx.data.preferences import (
    PairStats,
    collate,
    load_pairs,
    pairs_from_samples,
    prepare_pairs,
)
from rlx.errors import UserError
from rlx.models.loading import load_tokenizer


def _cfg(path, **kw):
    base = dict(source="file", path=str(path), eval_path=None, id=None, subset=None, train_split="train",
                eval_split=None, eval_size=2, layout="auto",
                columns=dict(prompt="prompt", chosen="chosen", rejected="rejected", margin=None),
                max_prompt_length=192, max_completion_length=64, truncation="drop", on_invalid="raise")
    base.update(kw)
    return OmegaConf.create(base)


def _write(tmp_path, rows, name="p.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def _good(i):
    return {"prompt": f"what is {i} + 1?", "chosen": f"<answer>{i + 1}</answer>", "rejected": f"<answer>{i}</answer>"}


def test_text_and_message_layouts_give_the_same_pair(tmp_path):
    text = _good(3)
    messages = {"prompt": "ignored when turns precede the answer",
                "chosen": [{"role": "user", "content": text["prompt"]},
                           {"role": "assistant", "content": text["chosen"]}],
                "rejected": [{"role": "user", "content": text["prompt"]},
                             {"role": "assistant", "content": text["rejected"]}]}
    path = _write(tmp_path, [text, messages] + [_good(i) for i in range(10, 14)])
    train, evals, stats = load_pairs(_cfg(path, eval_size=0), seed=0)
    assert stats.loaded == 6 and len(train) == 6 and evals == []
    a, b = train[0], train[1]
    assert a["messages"] == b["messages"] == [{"role": "user", "content": "what is 3 + 1?"}]
    assert (a["chosen"], a["rejected"]) == (b["chosen"], b["rejected"]) == ("<answer>4</answer>", "<answer>3</answer>")


@pytest.mark.parametrize("bad,reason", [
    ({"prompt": "q", "rejected": "b"}, "missing field 'chosen'"),
    ({"chosen": "a", "rejected": "b"}, "missing field 'prompt'"),
    ({"prompt": "q", "chosen": "  ", "rejected": "b"}, "empty chosen"),
    ({"prompt": "q", "chosen": "same", "rejected": "same"}, "chosen == rejected"),
])
def test_malformed_row_is_named_or_skipped_and_counted(tmp_path, bad, reason):
    path = _write(tmp_path, [_good(0), _good(1), bad, _good(2), _good(3)])
    with pytest.raises(UserError) as err:
        load_pairs(_cfg(path), seed=0)
    assert f"row 2: {reason}" in str(err.value) and "on_invalid=skip" in str(err.value)
    train, evals, stats = load_pairs(_cfg(path, on_invalid="skip"), seed=0)
    assert stats.invalid == {reason: 1}
    assert len(train) + len(evals) == 4
    assert stats.as_metrics("data")["data/invalid_skipped"] == 1


def test_held_out_split_shares_no_prompt(tmp_path):
    rows = [_good(i % 5) | {"chosen": f"c{i}"} for i in range(20)]  # 5 prompts, 4 pairs each
    train, evals, _ = load_pairs(_cfg(_write(tmp_path, rows), eval_size=2), seed=0)
    assert len(evals) == 2  # eval_size caps pairs after holding out 2 prompts (8 pairs)
    assert len(train) == 12
    assert not {json.dumps(p["messages"]) for p in train} & {json.dumps(p["messages"]) for p in evals}


def test_truncation_modes_never_cut_the_prompt(tmp_path):
    tok = load_tokenizer(str(ASSETS_DIR / "tiny"))
    long_prompt = {"prompt": "9 + " * 200, "chosen": "a", "rejected": "b"}
    long_answer = {"prompt": "q", "chosen": "1 " * 100, "rejected": "b"}
    rows = [_good(0), long_prompt, long_answer]

    def run(mode):
        cfg = _cfg(_write(tmp_path, rows), eval_size=0, truncation=mode, max_prompt_length=40, max_completion_length=10)
        train, _, stats = load_pairs(cfg, seed=0)
        return prepare_pairs(cfg, tok, train, True, None, stats), stats

    kept, stats = run("drop")
    assert [p["row"] for p in kept] == [0] and stats.too_long_dropped == 2
    kept, stats = run("truncate_completion")
    assert [p["row"] for p in kept] == [0, 2] and stats.too_long_dropped == 1 and stats.completions_truncated == 1
    assert len(kept[1]["chosen_tokens"]) == 10
    assert kept[0]["chosen_tokens"][-1] == tok.eos_token_id  # a complete completion keeps its EOS
    with pytest.raises(UserError, match="preference row 1: prompt longer than data.pairs.max_prompt_length"):
        run("error")
    # collate: prompts left-padded, completions right-padded
    batch = collate(kept, tok.pad_token_id)
    assert batch.prompt_mask[:, -1].tolist() == [1, 1] and batch.chosen_mask[:, 0].tolist() == [1, 1]
    # the rendered prompt ends with the chat template's generation prompt
    assert kept[0]["prompt"].endswith("<|im_start|>assistant\n")


def test_bad_layout_and_missing_file(tmp_path):
    with pytest.raises(UserError, match="valid choices: auto, text, messages"):
        load_pairs(_cfg(_write(tmp_path, [_good(0)]), layout="rows"), seed=0)
    with pytest.raises(UserError, match="rlx data prefs"):
        load_pairs(_cfg(tmp_path / "nope.jsonl"), seed=0)
    assert PairStats().as_metrics("x")["x/pairs"] == 0


def test_pairs_from_samples_pairs_correct_with_incorrect():
    rows = [{"prompt": "p0", "answer": "1"}, {"prompt": "p1", "answer": "2"}, {"prompt": "p2", "answer": "3"}]
    texts = ["a", "b", "c", "d",  # p0: one right (b), three wrong -> a pair
             "e", "f", "g", "h",  # p1: all right -> no pair
             "i", "j", "k", "l"]  # p2: all wrong -> no pair
    scores = [0, 1, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0]
    pairs = pairs_from_samples(rows, texts, scores, group_size=4, pairs_per_prompt=2, seed=0)
    assert len(pairs) == 2 and {p["prompt"] for p in pairs} == {"p0"}
    assert all(p["chosen"] == "b" and p["rejected"] in {"a", "c", "d"} for p in pairs)
    assert pairs[0]["rejected"] != pairs[1]["rejected"]


def test_pairs_from_samples_leave_out_completions_cut_at_the_budget():
    # training appends the end token to chosen and rejected: a completion cut mid-answer would be taught as whole
    rows = [{"prompt": "p0", "answer": "1"}, {"prompt": "p1", "answer": "2"}]
    texts = ["right", "right but cu", "wrong", "wrong but cu",  # p0: a finished pair, the cut ones left out
             "right", "wrong but cu", "wro", "ng"]             # p1: its only wrong samples are cut -> no pair
    scores = [1, 1, 0, 0, 1, 0, 0, 0]
    finished = [True, False, True, False, True, False, False, False]
    pairs = pairs_from_samples(rows, texts, scores, group_size=4, pairs_per_prompt=4, seed=0, finished=finished)
    assert [(p["prompt"], p["chosen"], p["rejected"]) for p in pairs] == [("p0", "right", "wrong")]


@pytest.mark.parametrize("pairs, seed, steps, batch", [(10, 0, 2, 3), (10, 5, 3, 4), (7, 1, 5, 2), (3, 0, 1, 8)])
def test_pairs_drawn_are_those_the_stream_hands_out(pairs, seed, steps, batch):
    # the DPO reference pass scores only these: they must cover every pair the training loop will draw
    from rlx.data.sources import PromptStream
    from rlx.loops.preference import pairs_drawn

    stream = PromptStream(list(range(pairs)), seed)
    drawn = {i for _ in range(steps) for i in stream.take(batch)}
    assert pairs_drawn(pairs, seed, steps * batch) == sorted(drawn)
