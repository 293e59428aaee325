"""Rounds with and without overlap across steps (rollout.server.overlap_steps), on a fleet of fake servers that
model decoding time: the producer's wall time per step, the rounds, and the tokens drawn ahead and dropped.

    python benchmarks/overlap_rounds.py                       # 2, 4 and 8 servers, the defaults below
    python benchmarks/overlap_rounds.py --servers 4 --steps 8 --json /tmp/overlap.json

The servers are tests/fake_vllm.py in threads of this process: a request takes `prefill_s` plus `token_s` per token
it answers, a server works on at most `per_server` requests at once (rlx's rollout.server.per_server_concurrency),
and a row's length before its stop token is drawn from 1 + (seed // 3) % tail tokens per request (a long tail of
row lengths, cut at max_new_tokens). The draws depend on the weight version a server holds, so the check that
both schedules drew the same rows is a real one. Each step's weights are ready when the step before begins (the
generation-bound case, where the trainer is faster than the fleet): an upper bound on what overlap gains. What
it leaves out: a real engine's batching (a fake's requests run side by side at full speed), the weight push's
cost (the fake's reload is instant), and the trainer.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def run(servers: int, overlap: bool, args) -> dict:
    from rlx.engines.lane import NoLane
    from rlx.fleet.backends import build_generator
    from rlx.fleet.overlap import StepOverlap
    from rlx.models.loading import load_causal_lm, load_tokenizer
    from rlx.rewards import RewardComponent
    from rlx.rollout.partial import PartialProducer
    from rlx.rollout.rounds import Rounds
    from rlx.rollout.single_turn import SingleTurnSettings
    from tests.fake_vllm import FakeVLLM
    from tests.test_partial import InOrder
    from tests.test_server_unit import rollout_cfg

    model, tok = load_causal_lm("builtin:tiny"), load_tokenizer("builtin:tiny")
    fleet = [FakeVLLM(versioned=True, tail=args.tail, slow_s=args.prefill_s, per_token_s=args.token_s)
             for _ in range(servers)]
    work = Path(tempfile.mkdtemp(prefix="rlx-overlap-bench-"))
    gen = build_generator(rollout_cfg(urls=[f.url for f in fleet], work_dir=str(work), request_timeout_s=60,
                                      invariance_probe_rows=0, per_server_concurrency=args.per_server,
                                      max_concurrency=max(64, servers * args.per_server)), model, tok, 0)
    stream = InOrder([{"prompt": f"{a} + {b} =", "answer": "x"} for a in range(40) for b in range(5)], seed=0)
    rewards = [RewardComponent("task", lambda prompts, completions, **_: [float(len(c)) for c in completions], 1.0)]
    settings = SingleTurnSettings(group_size=args.group, prompts_per_step=args.prompts, max_new_tokens=args.max_new,
                                  min_new_tokens=0, seed=3, use_chat_template=False, system_prompt=None,
                                  on_error="raise", accuracy_key="task", total_steps=args.steps)
    lane = StepOverlap(gen, lambda step: (step - 1, model), per_server=args.per_server) if overlap else NoLane()
    made = PartialProducer(gen, tok, stream, rewards, settings, oversample=args.oversample,
                           rounds=Rounds(args.segment, work / "rounds.jsonl", lane=lane))
    times, rows, dropped, rounds = [], [], 0.0, 0.0
    try:
        for step in range(1, args.steps + 1):
            if step > 1:
                gen.publish(model, step - 1)
            began = time.perf_counter()
            batch = made.produce(step)
            times.append(time.perf_counter() - began)
            rows.append(batch.rollout.completion_ids.tolist())
            dropped += batch.metrics.get("rollout/overlap_tokens_dropped", 0.0)
            rounds += batch.metrics["rollout/rounds"]
    finally:
        gen.close()
        for fake in fleet:
            fake.close()
    journal = [json.loads(x) for x in (work / "rounds.jsonl").read_text().splitlines()]
    drawn = sum(line["tokens"] for line in journal)
    return {"servers": servers, "overlap": overlap, "seconds_per_step": sum(times[1:]) / max(1, len(times) - 1),
            "rounds_per_step": rounds / args.steps, "tokens_trained_or_carried": drawn,
            "tokens_dropped": dropped, "rows_drawn_ahead": sum(line.get("drawn_ahead", 0) for line in journal),
            "rows": rows}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--oversample", type=float, default=2.0)
    parser.add_argument("--max-new", type=int, default=128)
    parser.add_argument("--segment", type=int, default=8)
    parser.add_argument("--tail", type=int, default=40)
    parser.add_argument("--per-server", type=int, default=8)
    parser.add_argument("--prefill-s", type=float, default=0.005)
    parser.add_argument("--token-s", type=float, default=0.004)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    results = []
    print("| servers | overlap | s per step | speed-up | rounds per step | rows drawn ahead | tokens dropped |")
    print("|---|---|---|---|---|---|---|")
    for servers in args.servers:
        plain = run(servers, False, args)
        over = run(servers, True, args)
        if plain["rows"] != over["rows"]:
            raise SystemExit(f"{servers} servers: the two schedules drew different rows")
        for result in (plain, over):
            speed = plain["seconds_per_step"] / result["seconds_per_step"]
            print(f"| {servers} | {'on' if result['overlap'] else 'off'} | {result['seconds_per_step']:.3f} | "
                  f"{speed:.2f}x | {result['rounds_per_step']:.1f} | {result['rows_drawn_ahead']} | "
                  f"{result['tokens_dropped']:.0f} of "
                  f"{result['tokens_dropped'] + result['tokens_trained_or_carried']:.0f} |")
            results.append({k: v for k, v in result.items() if k != "rows"} | {"speed_up": speed})
    out = {"settings": {k: v for k, v in vars(args).items() if k != "json"}, "results": results,
           "same_rows": True}
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
