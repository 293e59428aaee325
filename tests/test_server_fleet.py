"""A fleet of rollout servers (rollout.server.urls with several, or num_servers children) against fakes of
vLLM's endpoints (tests/fake_vllm.py): routing by load with a prompt's group on one server, the per-server
limit, failover of a lost server's seeded requests (the rows are the ones the full fleet draws), min_servers,
a returning server caught up to the current weights before it gets work, and child servers started side by
side. The real vLLM fleet: tests/test_server_rollout.py (`make test-vllm`)."""

import os
import signal
import sys

import pytest

from rlx.errors import RolloutServerError, UserError
from rlx.fleet.client import RequestPolicy, ServerClient
from rlx.fleet.process import check_server_settings
from tests.fake_vllm import completion_ids
from tests.test_server_unit import build, rollout_cfg

PROMPTS = [[1, 40, 41], [1, 42], [1, 43, 44, 45], [1, 46], [1, 47, 48], [1, 49]]
G = 2
SEEDS = list(range(100, 100 + len(PROMPTS) * G))
EXPECTED = [completion_ids(s) + [2] for s in SEEDS]  # what any server draws for these seeds (stop id 2)


@pytest.fixture(scope="module")
def tiny():
    from rlx.models.loading import load_causal_lm, load_tokenizer

    return load_causal_lm("builtin:tiny"), load_tokenizer("builtin:tiny")


def served_prompts(fake):
    return [tuple(body["prompt"]) for body in fake.completions()]


def generate(gen):
    return gen.generate_ids(PROMPTS, max_new_tokens=5, seeds=SEEDS, samples_per_prompt=G)


def test_groups_go_by_load_one_server_each_within_the_per_server_limit(fakes, tiny, tmp_path):
    """Slow servers with one request at a time each: both are used, neither has two requests in flight, each
    prompt's rows are on one server, and the rows are what one server alone draws."""
    model, tok = tiny
    a, b = fakes(slow_s=0.05), fakes(slow_s=0.05)
    gen = build([a.url, b.url], model, tok, tmp_path, per_server_concurrency=1)
    out = generate(gen)
    assert out.ids == EXPECTED
    assert a.most_in_flight == 1 and b.most_in_flight == 1
    assert served_prompts(a) and served_prompts(b)
    for prompt in PROMPTS:
        assert (tuple(prompt) in served_prompts(a)) != (tuple(prompt) in served_prompts(b))
    assert gen.step_metrics()["rollout/servers_live"] == 2
    gen.close()


def test_a_lost_server_fails_over_and_a_returning_one_is_caught_up_first(fakes, tiny, tmp_path):
    """b stops answering: its requests go to a with the same seeds (same rows), the step counts the failover,
    weight pushes go on without b; b answers again: the next push brings it the current weights and version
    before any request goes to it."""
    model, tok = tiny
    a, b = fakes(), fakes()
    gen = build([a.url, b.url], model, tok, tmp_path)
    assert generate(gen).ids == EXPECTED
    gen.step_metrics()
    port = b.port
    b.close()
    out = generate(gen)
    assert out.ids == EXPECTED  # the fleet's rows, drawn by a alone
    metrics = gen.step_metrics()
    assert metrics["rollout/servers_live"] == 1 and metrics["rollout/server_failovers"] >= 1
    gen.sync_weights(model, version=1)  # b is out: the push goes to a alone
    assert a.version == "1" and gen.client.urls == [a.url]
    b.requests.clear()
    b.start(port)  # back, with no weights of rlx's
    assert b.version is None
    a.requests.clear()
    gen.sync_weights(model, version=2)
    assert b.version == "2" and gen.client.urls == [a.url, b.url]
    assert b.paths()[:1] == ["/health"] and "/collective_rpc" in b.paths()  # probed, reloaded, stamped
    assert b.paths().index("/collective_rpc") < b.paths().index("/update_weight_version")
    b.requests.clear()
    assert generate(gen).ids == EXPECTED and served_prompts(b)  # b gets work again
    gen.close()


def test_below_min_servers_the_run_stops_with_one_resumable_line(fakes, tiny, tmp_path):
    model, tok = tiny
    a, b = fakes(), fakes()
    gen = build([a.url, b.url], model, tok, tmp_path, min_servers=2)
    b.close()
    with pytest.raises(RolloutServerError, match=r"1 of 2 rollout servers live, fewer than rollout.server.min_servers=2"
                                                 r" \(lost: http://127.0.0.1:\d+: ") as caught:
        generate(gen)
    assert caught.value.resumable
    gen.close()


@pytest.mark.parametrize("mode", ["garbage", "hang"])
def test_a_garbage_or_hanging_server_is_dropped_and_its_rows_drawn_elsewhere(fakes, tiny, tmp_path, mode):
    """Garbage: retried on that server, then dropped. Hang: the first timeout drops it (another is live)."""
    model, tok = tiny
    a, b = fakes(), fakes()
    gen = build([a.url, b.url], model, tok, tmp_path, request_timeout_s=1, max_retries=1)
    b.mode, b.hang_s = mode, 3.0
    assert generate(gen).ids == EXPECTED
    assert gen.client.urls == [a.url] and gen.step_metrics()["rollout/server_failovers"] >= 1
    sent_to_b = [body["seed"] for body in b.completions()]
    if mode == "hang":  # each request that hung was not asked of b again
        assert sorted(sent_to_b) == sorted(set(sent_to_b))
    else:  # garbage: asked again (max_retries=1), then dropped
        assert len(sent_to_b) > len(set(sent_to_b))
    gen.close()


def test_every_server_lost_is_one_line(fakes, tiny, tmp_path):
    model, tok = tiny
    a, b = fakes(), fakes()
    gen = build([a.url, b.url], model, tok, tmp_path, max_retries=0)
    a.close()
    b.close()
    with pytest.raises(RolloutServerError, match="0 of 2 rollout servers live") as caught:
        generate(gen)
    assert caught.value.resumable and "\n" not in str(caught.value)
    gen.close()


def test_a_fixed_group_publisher_cannot_lose_a_member(fakes):
    """tolerates_loss=False (nccl, ipc: the servers' workers form one group): a loss ends the run, and lost
    servers are never brought back."""
    a, b = fakes(), fakes()
    client = ServerClient([a.url, b.url], RequestPolicy(timeout_s=2, concurrency=4), tolerates_loss=False)
    b.close()
    with pytest.raises(RolloutServerError, match="cannot go on without it"):
        client.everywhere("/reset_prefix_cache", {}, what="resetting")
    assert client.rejoin(lambda url: None) == []
    client.close()


def test_min_servers_above_the_fleet_is_refused():
    with pytest.raises(UserError, match=r"min_servers=3 is more than the 2 server\(s\).*set min_servers=2"):
        check_server_settings(rollout_cfg(urls=["http://127.0.0.1:8000", "http://127.0.0.1:8001"], min_servers=3))
    with pytest.raises(UserError, match=r"min_servers=2 is more than the 1 server"):
        check_server_settings(rollout_cfg(python=sys.executable, min_servers=2))


def fake_python(tmp_path):
    """An executable that stands in for the server's Python: it runs tests/fake_vllm.py with vLLM's arguments."""
    script = tmp_path / "fake-python"
    fake = os.path.join(os.path.dirname(__file__), "fake_vllm.py")
    script.write_text(f"#!/bin/sh\nshift 2\nexec {sys.executable} {fake} \"$@\"\n")  # drops `-m MODULE`
    script.chmod(0o755)
    return str(script)


def test_child_servers_start_side_by_side_a_killed_one_is_failed_over_and_restarted(tiny, tmp_path):
    """num_servers=2 children ({index} in launch_prefix and env becomes 0, 1); kill -9 of one: its exit is
    noticed at once, the rows come from the other, the run goes on; the next update starts it again and the
    one after brings it back; with no restart left it stays out."""
    model, tok = tiny
    gen = build([], model, tok, tmp_path, python=fake_python(tmp_path), num_servers=2, restarts=1,
                launch_prefix=["env", "RLX_FAKE_INDEX={index}"], env={"RLX_CORE": "{index}"}, startup_timeout_s=60)
    try:
        assert len(gen.client.urls) == 2 and len(gen.processes) == 2
        assert [p.launch_prefix for p in gen.processes] == [["env", "RLX_FAKE_INDEX=0"], ["env", "RLX_FAKE_INDEX=1"]]
        assert [p.env["RLX_CORE"] for p in gen.processes] == ["0", "1"]
        assert {p.log_path.name for p in gen.processes} == {"server-0.log", "server-1.log"}
        assert generate(gen).ids == EXPECTED
        os.killpg(gen.processes[1].guard.pid, signal.SIGKILL)
        gen.processes[1].guard.wait(timeout=10)
        assert generate(gen).ids == EXPECTED
        assert gen.client.urls == [gen.processes[0].url]
        gen.sync_weights(model, version=1)  # the lost child is started again (restarts=1) ...
        assert gen.restarts_left == [1, 0] and gen.processes[1].exit_note() is None
        gen.processes[1].wait_ready(30)
        gen.sync_weights(model, version=2)  # ... and rejoins, caught up, at the next update
        assert gen.client.urls == [p.url for p in gen.processes]
        assert gen.step_metrics()["rollout/servers_live"] == 2
        assert generate(gen).ids == EXPECTED
        os.killpg(gen.processes[1].guard.pid, signal.SIGKILL)  # no restart left: it stays out
        gen.processes[1].guard.wait(timeout=10)
        assert generate(gen).ids == EXPECTED
        gen.sync_weights(model, version=3)
        assert gen.processes[1].exit_note() is not None and gen.client.urls == [gen.processes[0].url]
    finally:
        gen.close()


def test_strict_mode_probes_every_server_and_refuses_batch_variant_kernels(fakes, tiny, tmp_path):
    """rollout.server.strict=true: each server draws 8 seeded rows batched and alone at start; a batch-variant
    server is refused in one line naming it; an invariant fleet is probed every batch (counted, none differ)."""
    model, tok = tiny
    a, b = fakes(slow_s=0.02), fakes(slow_s=0.02, mode="variant")
    with pytest.raises(UserError, match=rf"strict=true: the rollout server {b.url} drew \d of 8 seeded rows "
                                        r"differently alone than batched .*VLLM_BATCH_INVARIANT=1"):
        build([a.url, b.url], model, tok, tmp_path / "refused", strict=True)
    c = fakes(slow_s=0.02)
    gen = build([a.url, c.url], model, tok, tmp_path / "strict", strict=True, invariance_probe_every=10)
    for _ in range(2):
        assert generate(gen).ids == EXPECTED
        metrics = gen.step_metrics()
        assert metrics["rollout/invariance_probed"] == 1 and metrics["rollout/invariance_differ"] == 0
    gen.close()


def test_the_probe_measures_batch_variance_and_the_run_goes_on(fakes, tiny, tmp_path):
    """Not strict: every `invariance_probe_every`-th batch, its last row is drawn again alone; a variant
    server's row differs and is counted (rollout/invariance_differ), a warning says why, nothing stops."""
    model, tok = tiny
    fake = fakes(slow_s=0.02, mode="variant")
    gen = build([fake.url], model, tok, tmp_path, invariance_probe_rows=1, invariance_probe_every=2)
    generate(gen)
    assert gen.step_metrics()["rollout/invariance_differ"] == 1
    generate(gen)  # the second batch is not probed
    assert "rollout/invariance_probed" not in gen.step_metrics()
    generate(gen)
    assert gen.step_metrics()["rollout/invariance_probed"] == 1
    gen.close()
