"""`rlx gateway`: serve a model through the OpenAI-compatible gateway, to try a harness by hand.

    rlx gateway model.path=builtin:tiny_agent [rollout.temperature=0.7] [env.max_new_tokens=64] \
        [env.tool_parser=hermes] [env.chat_template=FILE] [--port 8000] [--host 127.0.0.1] [--allow-remote] \
        [--record sessions.jsonl]

Settings are `rlx train` keys (the model group, the rollout group's sampling settings, the env=harness
group's limits, tool parser and template). It prints the base URL and the token, then serves until
Ctrl-C. /sessions/NAME/v1 records a session (opened at its first call) with token-in/token-out exactly as
training does; /v1 answers without recording. --record writes every session's rows (token ids, loss mask,
text) to a JSON-lines file at exit.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import threading

log = logging.getLogger("rlx")


def _record(gateway, path: str, tokenizer) -> None:
    with open(path, "w") as handle:
        for sid, session in gateway.sessions.items():
            rows = [{"prompt": tokenizer.decode(r.prompt_ids), "text": tokenizer.decode(r.ids),
                     "prompt_ids": r.prompt_ids,
                     "ids": r.ids, "loss_mask": r.loss_mask, "logprobs": r.logprobs} for r in session.rows]
            handle.write(json.dumps({"session": sid, "calls": len(session.calls), "forks": session.forks,
                                     "fork_reasons": session.fork_reasons, "rows": rows}) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlx gateway", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="rlx train keys: model.path=..., rollout.temperature=..., env.*")
    parser.add_argument("--host", default=None, help="address to bind (default: env.host, 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port (default: one the OS picks)")
    parser.add_argument("--allow-remote", action="store_true", help="allow a host that is not a loopback address")
    parser.add_argument("--token", default=None, help="the API key clients must send (default: a random one)")
    parser.add_argument("--record", default=None, help="write every session's token rows to this .jsonl at exit")
    args = parser.parse_args(argv)
    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        parser.error(f"expected key=value settings, got {' '.join(bad)}")
    import rlx.cli.registries  # noqa: F401  every registry publishes its names before the config is checked
    from rlx.config.overrides import check_overrides
    from rlx.config.settings import checked_settings
    from rlx.errors import UserError, fail

    cfg = check_overrides(["env=harness", *args.overrides])
    try:
        return _serve(checked_settings(cfg), args)
    except UserError as exc:
        fail(str(exc))
    return 2


def _serve(s, args) -> int:
    """Serve the policy of the typed settings `s` (an `rlx train` TrainConfig with env=harness) until SIGTERM."""
    import torch

    from rlx.engines.generator import policy_generator
    from rlx.engines.hf import eos_ids
    from rlx.gateway.harness import HarnessSettings
    from rlx.gateway.server import Gateway, GatewayError
    from rlx.models.loading import load_causal_lm, load_tokenizer

    if s.hardware.num_threads:
        torch.set_num_threads(int(s.hardware.num_threads))
    path = s.model.path
    tokenizer = load_tokenizer(path, s.model.revision, s.model.trust_remote_code)
    model = load_causal_lm(path, s.model.dtype, s.model.revision, s.model.trust_remote_code).eval()
    settings = HarnessSettings.from_env(s.env, greedy=False).gateway
    settings.auto_sessions, settings.model_name = True, str(path)
    generator = policy_generator(model, tokenizer, s.rollout, logprobs="sampler")
    host = args.host or str(s.env.host)
    try:
        gateway = Gateway(generator, tokenizer, settings, stop_ids=eos_ids(model, tokenizer), host=host, port=args.port,
                          allow_remote=args.allow_remote or bool(s.env.allow_remote), token=args.token)
        gateway.start()
    except GatewayError as exc:
        from rlx.errors import UserError

        raise UserError(str(exc)) from None
    done = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: done.set())
    print(f"rlx gateway: {path} (temperature {generator.temperature}, top_p {generator.top_p}, top_k "
          f"{generator.top_k}; at most {settings.max_new_tokens} tokens a call)")
    print(f"base_url: {gateway.base_url()}   (record a session: {gateway.url}/sessions/NAME/v1)")
    print(f"api_key:  {gateway.token}", flush=True)
    try:
        while not done.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        gateway.stop()
        if args.record:
            _record(gateway, args.record, tokenizer)
            print(f"sessions written to {args.record}")
    return 0
