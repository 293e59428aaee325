"""Pipeline mode (rollout.max_staleness = k > 0, rlx/rollout/pipeline.py): which weights sampled which batch, the
overlap of sampling and training, checkpoints of the queued batches, faults and shutdown, on a fake producer whose
cost is a sleep; then the real loop (tiny model): k = 1 at lr 0 samples what the synchronous run samples, and the
default run builds the synchronous path."""

import threading
import time

import pytest
import torch

from rlx.algorithms.grouping import fixed_groups
from rlx.config.settings import settings as typed_settings
from rlx.engines.records import Rollout
from rlx.rollout.pipeline import PipelineGenerator, PipelineProducer, rollout_copy
from rlx.rollout.types import Batch, PromptRows, no_verdicts
from rlx.runtime.rundir import read_metrics
from tests.loop_fixtures import one_thread  # noqa: F401 (fixture)


class Policy(torch.nn.Module):
    """A one-number policy: its weight is the number of updates it has had (the trainer sets it to the step)."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.frozen = torch.nn.Parameter(torch.full((1,), 7.0), requires_grad=False)


class Recorder:
    """A generator on the rollout copy: the version it was published, and what it holds."""

    def __init__(self, model):
        self.model, self.version, self.published, self.closed = model, 0, [], False
        self.interrupt = None

    def publish(self, model, version):
        assert model is self.model
        self.version = version
        self.published.append(version)

    def step_metrics(self):
        return {"perf/weight_sync_s": 0.0}

    def close(self):
        self.closed = True


class Stream:
    """A data position, checkpointed like PromptStream."""

    def __init__(self):
        self.index = 0

    def state_dict(self):
        return {"index": self.index}

    def load_state_dict(self, state):
        self.index = state["index"]


class FakeProducer:
    """Batch s: one row per draw, stamped with the generator's version; records the copy's weight at sampling time
    (what weights really sampled it) and the stream position. `cost` seconds of sleep per batch."""

    loss_width = 4

    def __init__(self, generator, cost=0.0, fail_at=None):
        self.generator, self.cost, self.fail_at, self.stream = generator, cost, fail_at, Stream()
        self.log = []  # (step, version stamped, weight of the copy, stream index)
        self.thread_ids = set()

    def checkpointed(self):
        return {"data": self.stream}

    def produce(self, step):
        self.thread_ids.add(threading.get_ident())
        if step == self.fail_at:
            raise RuntimeError(f"reward crashed at step {step}")
        time.sleep(self.cost)
        version, weight = self.generator.version, self.generator.model.weight.item()
        self.log.append((step, version, weight, self.stream.index))
        self.stream.index += 2
        rollout = Rollout.single_turn(torch.zeros(2, 1, dtype=torch.long), torch.ones(2, 1, dtype=torch.long),
                                      torch.full((2, 3), step), torch.ones(2, 3, dtype=torch.long),
                                      torch.zeros(2, dtype=torch.bool), [f"s{step}"] * 2, None, version)
        return Batch(rollout, torch.tensor([float(step), weight]), 2, fixed_groups(2, 2), no_verdicts(),
                     PromptRows([{}] * 2, [""] * 2), metrics={"reward/total": float(step)})

    def records(self, batch, samples, count):
        return []


def pipeline(k, steps, cost=0.0, fail_at=None, policy=None):
    policy = policy or Policy()
    copy = rollout_copy(policy)
    generator = Recorder(copy)
    inner = FakeProducer(generator, cost, fail_at)
    producer = PipelineProducer(inner, generator, copy, policy, max_staleness=k, total_steps=steps)
    return policy, producer, PipelineGenerator(producer, Recorder(policy)), inner


def train(policy, producer, generator, first, last, update_cost=0.0):
    """The loops' order: batch s, update s (the weight becomes s), publish s. Returns the batches and step times."""
    batches, times = {}, []
    for step in range(first, last + 1):
        began = time.perf_counter()
        batches[step] = producer.produce(step)
        time.sleep(update_cost)
        with torch.no_grad():
            policy.weight.fill_(float(step))
        generator.publish(policy, step)
        times.append(time.perf_counter() - began)
    return batches, times


@pytest.mark.parametrize("k", [1, 2, 3])
def test_batch_s_is_sampled_with_the_weights_of_update_s_minus_1_minus_k(k):
    """Version stamped = weight held by the copy = max(0, s-1-k) for every batch; data positions in step order; the
    staleness metrics are (s-1) - version; the trainer's own weights never went into the copy unpublished."""
    policy, producer, generator, inner = pipeline(k, steps=8)
    batches, _ = train(policy, producer, generator, 1, 8)
    generator.close()
    want = [max(0, s - 1 - k) for s in range(1, 9)]
    assert [v for _, v, _, _ in inner.log] == want
    assert [w for _, _, w, _ in inner.log] == [float(v) for v in want]  # the copy held exactly that version
    assert [i for _, _, _, i in inner.log] == [2 * (s - 1) for s in range(1, 9)]
    for s, batch in batches.items():
        assert batch.rollout.versions.tolist() == [want[s - 1]] * 2
        assert batch.metrics["rollout/staleness_max"] == s - 1 - want[s - 1] == min(s - 1, k)
    assert inner.thread_ids and threading.get_ident() not in inner.thread_ids  # sampled off the trainer's thread
    assert inner.generator.published == list(range(1, 8 - k))  # versions 1 .. 7-k were needed (and loaded once each)
    assert policy.frozen.item() == producer.rollout_model.frozen.item() == 7.0


def test_sampling_and_training_overlap():
    """Sampling 0.15 s and an update 0.15 s per step: synchronous steps take 0.3 s; k = 1 overlaps them, so the
    median step (after the first, which waits for its batch) takes max(0.15, 0.15) = 0.15 s: <= 0.6x."""
    cost = 0.15
    sync_times = []
    inner = FakeProducer(Recorder(Policy()), cost)
    for step in range(1, 7):
        began = time.perf_counter()
        inner.produce(step)
        time.sleep(cost)
        sync_times.append(time.perf_counter() - began)
    policy, producer, generator, _ = pipeline(1, steps=6, cost=cost)
    _, times = train(policy, producer, generator, 1, 6, update_cost=cost)
    generator.close()
    median = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    assert median(times[1:]) <= 0.6 * median(sync_times[1:]), (times, sync_times)


@pytest.mark.parametrize("k,stop_after", [(1, 3), (2, 3), (2, 1), (1, 5)])
def test_a_checkpoint_holds_the_queued_batches_and_resumes_exactly(k, stop_after):
    """After step s the checkpoint holds batches s+1 .. s+k as sampled (older weights than the checkpoint's) and the
    data position after s+k; a new pipeline loaded from it, given the trainer's weights of step s, hands out exactly
    the batches of an uninterrupted run."""
    policy, producer, generator, _ = pipeline(k, steps=6)
    whole, _ = train(policy, producer, generator, 1, 6)
    generator.close()

    policy, producer, generator, _ = pipeline(k, steps=6)
    train(policy, producer, generator, 1, stop_after)
    state = producer.state_dict()
    generator.close()
    assert sorted(state["pending"]) == list(range(stop_after + 1, min(stop_after + k, 6) + 1))
    assert state["inner"]["data"] == {"index": 2 * min(stop_after + k, 6)}

    policy, producer, generator, inner = pipeline(k, steps=6)
    with torch.no_grad():
        policy.weight.fill_(float(stop_after))  # the checkpoint's weights
    producer.load_state_dict(state)
    generator.publish(policy, stop_after)  # as the loops do on resume
    resumed, _ = train(policy, producer, generator, stop_after + 1, 6)
    generator.close()
    for step, batch in resumed.items():
        assert batch.rollout.versions.tolist() == whole[step].rollout.versions.tolist()
        assert batch.rewards.tolist() == whole[step].rewards.tolist()  # (step, weight that sampled it)
        assert torch.equal(batch.rollout.completion_ids, whole[step].rollout.completion_ids)
    assert [s for s, *_ in inner.log] == list(range(stop_after + k + 1, 7))  # the queued ones were not sampled again


def test_resuming_with_another_staleness_is_one_line():
    from rlx.errors import UserError

    policy, producer, generator, _ = pipeline(1, steps=4)
    train(policy, producer, generator, 1, 2)
    state = producer.state_dict()
    generator.close()
    _, other, other_generator, _ = pipeline(2, steps=4)
    with pytest.raises(UserError, match="checkpointed with rollout.max_staleness=1; resume it with the same value"):
        other.load_state_dict(state)
    other_generator.close()


def test_a_fault_in_the_producer_reaches_the_trainer_as_it_is():
    policy, producer, generator, _ = pipeline(1, steps=6, fail_at=3)
    with pytest.raises(RuntimeError, match="reward crashed at step 3"):
        train(policy, producer, generator, 1, 6)
    generator.close()
    assert not producer._thread.is_alive()


def test_close_stops_the_thread_and_the_generator_whatever_it_waits_for():
    """Closed while the producer waits for weights the trainer never publishes, and while it samples (a sleep)."""
    for cost in (0.0, 0.5):
        policy, producer, generator, _ = pipeline(1, steps=10, cost=cost)
        producer.produce(1)  # the producer now samples batch 2, then waits for version 1
        began = time.perf_counter()
        generator.close()
        assert not producer._thread.is_alive() and producer.generator.closed
        assert time.perf_counter() - began < 5


def test_the_producer_thread_is_pinned_and_the_trainer_keeps_the_other_cores():
    import os

    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs two cores")
    policy, producer, generator, inner = pipeline(1, steps=3)
    producer.producer_cpus = [cores[-1]]
    seen = {}
    real = inner.produce

    def produce(step):
        seen[step] = os.sched_getaffinity(0)
        return real(step)

    inner.produce = produce
    producer.produce(1)
    assert os.sched_getaffinity(0) == set(cores) - {cores[-1]}  # the trainer's thread
    generator.close()
    assert seen[1] == {cores[-1]} and os.sched_getaffinity(0) == set(cores)  # given back at close


# ------------------------------------------------------------------------------------------------
# The real loop on the tiny model
# ------------------------------------------------------------------------------------------------


def _samples(run_dir):
    import json

    return {path.name: [json.loads(line)["completion"] for line in path.read_text().splitlines()]
            for path in sorted((run_dir / "samples").glob("*.jsonl"))}


SAME = ["reward/total", "reward/accuracy", "completions/mean_length", "completions/max_length",
        "train/frac_zero_std_groups"]


def _run(tmp_path, *overrides):
    """The policy-gradient loop in-process on the tiny model and the default task, as `rlx train` runs it (the run's
    generator closed at the end, the producer thread with it)."""
    from rlx.build import build_parts
    from rlx.data.tasks import load_rows
    from rlx.loops.policy_gradient import train_policy_gradient
    from rlx.rewards import build_rewards
    from tests.loop_fixtures import components, loop_config, tiny_policy

    cfg = loop_config(*overrides)
    tmp_path.mkdir(parents=True)
    model, tokenizer = tiny_policy()
    train_rows, _ = load_rows(cfg.data, cfg.seed)
    parts = components(tmp_path, model, tokenizer, train_rows)
    parts.rewards = build_rewards(cfg.reward)
    built = build_parts(typed_settings(cfg), parts)
    try:
        train_policy_gradient(built.settings, built)
    finally:
        built.generator.close()
    return read_metrics(tmp_path / "metrics.jsonl")


@pytest.mark.usefixtures("one_thread")
def test_at_lr_0_one_step_off_samples_what_the_synchronous_run_samples(tmp_path):
    """optim.lr=0: every version holds the same weights, so k = 1 must sample the synchronous run's prompts with its
    seeds and draw the same tokens (samples files and outcome metrics equal), with staleness 1 from step 2 on."""
    common = ["steps=4", "optim.lr=0", "log.samples_every=1", "log.num_samples=64", "prompts_per_step=4"]
    sync_rows = _run(tmp_path / "sync", *common)
    async_rows = _run(tmp_path / "k1", *common, "rollout.max_staleness=1", "rollout.correction=tis")
    for a, b in zip(sync_rows, async_rows, strict=True):
        assert {key: a[key] for key in SAME} == {key: b[key] for key in SAME}
    assert _samples(tmp_path / "sync") == _samples(tmp_path / "k1") and len(_samples(tmp_path / "k1")) == 4
    assert [r["rollout/staleness_max"] for r in async_rows] == [0, 1, 1, 1]
    assert "rollout/staleness_max" not in sync_rows[0]


def test_the_default_run_builds_the_synchronous_path(tmp_path):
    """rollout.max_staleness=0 (the default): the producer is the single-turn producer itself and the generator the
    policy's own HFGenerator, as before pipeline mode existed: no copy, no thread."""
    from rlx.build import build_parts
    from rlx.engines.generator import HFGenerator
    from rlx.rollout.single_turn import SingleTurnProducer
    from tests.loop_fixtures import components, loop_config, rows, tiny_policy

    model, tokenizer = tiny_policy()
    threads = set(threading.enumerate())  # a thread another test left may end meanwhile: count only new ones
    parts = build_parts(typed_settings(loop_config("steps=2")), components(tmp_path, model, tokenizer, rows()))
    assert type(parts.producer) is SingleTurnProducer and type(parts.generator) is HFGenerator
    assert parts.generator.model is parts.accelerator.unwrap_model(parts.model)
    assert not set(threading.enumerate()) - threads
    parts.checkpointer.close()
    piped = build_parts(typed_settings(loop_config("steps=2", "rollout.max_staleness=1", "rollout.correction=tis")),
                        components(tmp_path, model, tokenizer, rows()))
    assert isinstance(piped.producer, PipelineProducer) and isinstance(piped.generator, PipelineGenerator)
    assert piped.producer.rollout_model is not model and piped.producer.generator.model is piped.producer.rollout_model
    # the producer thread tokenizes with its own tokenizer: a fast tokenizer's padding state is not thread-safe (an
    # evaluation padding its prompts on the trainer's thread broke the producer's unpadded encoding)
    assert piped.producer.inner.tokenizer is not tokenizer and piped.producer.generator.tokenizer is not tokenizer
    assert piped.producer.inner.tokenizer is piped.producer.generator.tokenizer
    piped.generator.close()
    piped.checkpointer.close()


# ------------------------------------------------------------------------------------------------
# Long checks (make test-slow): a real run killed with SIGKILL, resumed, equal to an uninterrupted one
# ------------------------------------------------------------------------------------------------

PIPELINE = ["rollout.max_staleness=1", "rollout.correction=tis"]


@pytest.mark.parametrize("extra", [pytest.param([], marks=pytest.mark.slow, id="k1"),
                                   pytest.param(["rollout.max_staleness=2", "rollout.partial=true"],
                                                marks=pytest.mark.long, id="k2-partial")])
def test_sigkill_then_resume_equals_an_uninterrupted_pipeline_run(tmp_path, extra):
    """kill -9 after step 3 (checkpoint at step 2 holds batches 3 .. 2+k, sampled with older weights than its own);
    the resumed run's metrics (all but wall-clock figures) and final weights equal an uninterrupted run's."""
    import signal

    from safetensors.torch import load_file

    from rlx.runtime.checkpoint import list_checkpoints
    from tests.conftest import only_run_dir, run_rlx
    from tests.test_checkpoint_resume import RUN, _comparable, _popen, _wait_for_step

    args = [*RUN, "steps=8", *PIPELINE, *extra]
    (tmp_path / "full").mkdir()
    full = run_rlx(["train", *args], tmp_path / "full")
    assert full.returncode == 0, full.stderr[-3000:]
    full_run = only_run_dir(tmp_path / "full")

    (tmp_path / "cut").mkdir()
    process = _popen(args, tmp_path / "cut")
    run = _wait_for_step(process, tmp_path / "cut", 3)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert read_metrics(run / "metrics.jsonl")[-1]["step"] < 8 and list_checkpoints(run)
    resumed = run_rlx(["train", f"resume={run}"], tmp_path / "cut")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    got, want = _comparable(read_metrics(run / "metrics.jsonl")), _comparable(read_metrics(full_run / "metrics.jsonl"))
    assert got == want
    assert max(r.get("rollout/staleness_max", 0) for r in got) >= 1
    want_w, got_w = load_file(full_run / "final" / "model.safetensors"), load_file(run / "final" / "model.safetensors")
    assert all(torch.equal(want_w[key], got_w[key]) for key in want_w)


@pytest.mark.long
def test_ctrl_c_in_pipeline_mode_checkpoints_the_queue_and_resume_finishes(tmp_path):
    import signal

    from rlx.runtime.checkpoint import list_checkpoints
    from tests.conftest import run_rlx
    from tests.test_checkpoint_resume import RUN, _popen, _wait_for_step

    process = _popen([*RUN, "steps=6", "checkpoint.every=0", *PIPELINE], tmp_path)
    run = _wait_for_step(process, tmp_path, 1)
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 130, output[-3000:]
    assert "Traceback" not in output and "resume=" in output
    (stopped, _), = list_checkpoints(run)
    resumed = run_rlx(["train", f"resume={run}"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl") if r["step"]] == list(range(1, 7))
