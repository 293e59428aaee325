"""A producer of the user's own (rollout.producer; docs/extending/producers.md): tests/own_producer.py, one file built
from the single-turn core's pieces, trains, checkpoints its own state and resumes exactly; the options that act
inside rlx's own producer, a producer of the wrong rows and an unknown name stop in one line."""

import json
from dataclasses import replace

import pytest

from rlx.cli.training import check_run
from rlx.config.async_rules import rank_zero_reason
from rlx.config.overrides import check_overrides
from rlx.engines.records import Generation
from rlx.errors import UserError
from tests.conftest import run_rlx

PLUGIN = ["plugins=[tests.own_producer]", "rollout.producer=shortest_first"]
QUIET = ["hardware.num_threads=1", "eval.every=0", "eval.at_start=false", "save.plot=false", "log.samples_every=0"]


def _metrics(tmp_path, name):
    (run,) = (tmp_path / "outputs" / "train").glob(f"*_{name}")
    return run, [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_producer_of_ones_own_trains_and_resumes_where_it_stopped(tmp_path):
    common = ["train", *PLUGIN, *QUIET, "prompts_per_step=2", "rollout.samples_per_prompt=2", "checkpoint.every=1"]
    straight = run_rlx([*common, "steps=3", "name=straight"], tmp_path)
    assert straight.returncode == 0, straight.stderr[-2000:]
    assert "built: producer shortest_first" in straight.stderr + straight.stdout
    _, rows = _metrics(tmp_path, "straight")
    lengths = [row["curriculum/longest_question_chars"] for row in rows]
    assert lengths == sorted(lengths) and len(rows) == 3  # shortest questions first
    assert all(row["reward/total_std"] >= 0 and "completions/mean_length" in row for row in rows)
    # stopped after step 2 and resumed: step 3 takes the curriculum's next prompts, as the straight run did
    cut = run_rlx([*common, "steps=2", "name=cut"], tmp_path)
    assert cut.returncode == 0, cut.stderr[-2000:]
    run, _ = _metrics(tmp_path, "cut")
    resumed = run_rlx(["train", f"resume={run}", "steps=3"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    _, again = _metrics(tmp_path, "cut")
    assert again[-1]["step"] == 3
    for key in ("curriculum/longest_question_chars", "reward/total", "completions/mean_length", "train/loss"):
        assert again[-1][key] == rows[-1][key], key


def test_what_a_producer_of_ones_own_replaces_is_refused_in_one_line():
    s = check_run(check_overrides([*PLUGIN, "hardware=ddp", "hardware.cpu=true", "hardware.num_processes=2"]))
    assert rank_zero_reason(s, 2) == "rollout.producer=shortest_first"  # rank 0 calls it for the global batch
    for extra, message in ((["algorithm.replay.enabled=true"], "algorithm.replay.enabled acts in rlx's single-turn "
                                                               "producer, which rollout.producer=shortest_first "
                                                               "replaces"),
                           (["algorithm.dynamic_sampling=true"],
                            "algorithm.dynamic_sampling acts in rlx's single-turn"),
                           (["algorithm.prompt_sampling.source=stream"],
                            "algorithm.prompt_sampling.source acts in rlx's single-turn"),
                           (["rollout.partial=true", "rollout.correction=tis"],
                            "rollout.partial=true is rlx's partial-rollout producer, which "
                            "rollout.producer=shortest_first")):
        with pytest.raises(UserError, match=message) as info:
            check_run(check_overrides([*PLUGIN, *extra]))
        assert "\n" not in str(info.value)
    with pytest.raises(UserError, match=r"unknown rollout.producer 'nope'; valid choices: auto, .*shortest_first"):
        check_run(check_overrides([*PLUGIN[:1], "rollout.producer=nope"]))


def test_a_producer_of_the_wrong_rows_stops_at_its_first_batch():
    """The loops read what rows a batch holds from its record (Batch.source), and stop in one line on rows their family
    does not train (the check the policy-gradient and PPO loops make on every batch)."""
    import torch

    from rlx.engines.records import Rollout
    from rlx.loops.credit import CREDIT_RULES, credit_rule, require_rows
    from rlx.rollout.types import Batch, EpisodeRows, PromptRows

    rollout = Rollout.from_ids([[1]], Generation([[2]], None, [True]), 1, 0, ["x"])
    prompt_rows = Batch(rollout, torch.zeros(1), 1, torch.zeros(1, dtype=torch.long), torch.zeros(0, dtype=torch.bool),
                        PromptRows([{}], ["p"]))
    episode_rows = replace(prompt_rows, source=EpisodeRows([], torch.zeros(1, dtype=torch.long)))
    assert credit_rule(prompt_rows, "policy_gradient") is CREDIT_RULES[PromptRows]
    assert credit_rule(episode_rows, "agent") is CREDIT_RULES[EpisodeRows]
    require_rows(prompt_rows, "ppo")
    for batch, family, message in ((prompt_rows, "agent", "the producer handed PromptRows rows, and the agent family "
                                                          "trains EpisodeRows rows"),
                                   (episode_rows, "ppo", "the producer handed EpisodeRows rows, and the ppo family")):
        with pytest.raises(UserError, match=message) as info:
            require_rows(batch, family)
        assert "\n" not in str(info.value)
