"""The gateway: an OpenAI-compatible endpoint (app.py) served by uvicorn in a background thread, its
sessions (sessions.py) and the micro-batcher (batcher.py) in front of one Generator.

    with Gateway(generator, tokenizer, GatewaySettings(...)) as gateway:
        gateway.open_session("s0", sample_seed=7)
        OpenAI(base_url=gateway.base_url("s0"), api_key=gateway.token)   # the harness's own client
        ...
        session = gateway.close_session("s0")                              # its rows -> an Episode

Binds 127.0.0.1 on a port the OS picks unless told otherwise; a host that is not a loopback address is
refused unless allow_remote=True (the token is then the only protection: use it on a trusted network).
Every /v1 route needs the per-run token (Authorization: Bearer TOKEN, or TOKEN.SESSION_ID, which also
names the session). `version` is the policy version: the trainer sets it after each weight update and
every call records the version that sampled it. stop() (or leaving the `with` block, on any exit path)
stops the server and the batcher and closes every session.
"""

from __future__ import annotations

import logging
import secrets
import socket
import threading
import time
from dataclasses import dataclass

from rlx.fleet.process import is_loopback
from rlx.gateway.batcher import MicroBatcher
from rlx.gateway.chat import ChatRenderer, RequestError
from rlx.gateway.sessions import Limits, Session
from rlx.gateway.tools import TOOL_PARSERS

log = logging.getLogger("rlx")


class GatewayError(ValueError):
    """A gateway setting that cannot work (one line for the user)."""


@dataclass
class GatewaySettings:
    max_turns: int = 8                 # model calls per session
    max_new_tokens: int = 256          # sampled tokens per call (the request's max_tokens can lower it)
    max_total_tokens: int = 4096       # tokens of a row, prompt included
    max_batch: int = 64                # requests generated together at most
    max_wait_ms: float = 50.0          # how long the first waiting request waits for batch-mates
    tool_parser: str | None = "hermes"  # tools.TOOL_PARSERS name; None: replies are plain content
    chat_template: str | None = None   # Jinja text used instead of the tokenizer's chat template
    system_prompt: str | None = None   # put first when a conversation opens without a system message
    greedy: bool = False               # argmax decoding (held-out evaluation) instead of sampling
    model_name: str = "rlx"            # what GET /v1/models lists (any `model` in a request is accepted)
    auto_sessions: bool = False        # a call to an unknown session opens it (`rlx gateway`); else 404


class Gateway:
    def __init__(self, generator, tokenizer, settings: GatewaySettings | None = None, *,
                 stop_ids: list[int] | None = None,
                 host: str = "127.0.0.1", port: int = 0, allow_remote: bool = False, token: str | None = None):
        self.settings = settings = settings or GatewaySettings()
        if not is_loopback(host) and not allow_remote:
            raise GatewayError(f"the gateway binds {host!r}, not a loopback address: anyone who can reach it and "
                               "knows the token drives the model; set allow_remote (env.allow_remote=true) to mean it")
        if settings.tool_parser and settings.tool_parser not in TOOL_PARSERS:
            raise GatewayError(f"unknown tool parser '{settings.tool_parser}'; valid choices: "
                               f"{', '.join(TOOL_PARSERS)} (or null)")
        self.generator, self.tokenizer, self.host, self.port = generator, tokenizer, host, port
        self.token = token or secrets.token_hex(16)
        self.version = 0
        stop_ids = stop_ids if stop_ids is not None else [tokenizer.eos_token_id]
        self.stop_id = stop_ids[0] if stop_ids else None
        self.limits = Limits(settings.max_turns, settings.max_new_tokens, settings.max_total_tokens)
        has_template = bool(settings.chat_template or getattr(tokenizer, "chat_template", None))
        self.renderer = ChatRenderer(tokenizer, settings.chat_template) if has_template else None
        self.sessions: dict[str, Session] = {}
        self._open: set[str] = set()
        self._lock = threading.Lock()
        self.batcher = MicroBatcher(generator, max_batch=settings.max_batch, max_wait_s=settings.max_wait_ms / 1000,
                                    greedy=settings.greedy, waiting_for=self._waiting_for, version=lambda: self.version)
        # rlx's sampling settings (the generator's): they win over a request's, which is logged once per setting
        self.sampling = {k: getattr(generator, k) for k in ("temperature", "top_p", "top_k") if hasattr(generator, k)}
        self._noted: set[str] = set()
        self._server = self._thread = None

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout: float = 30.0) -> Gateway:
        import uvicorn

        from rlx.gateway.app import build_app

        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            # accepted connections inherit it: without, a response written as headers then body waits for the
            # client's delayed ACK (~40 ms per call on Linux)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.bind((self.host, self.port))
        except OSError as exc:
            sock.close()
            raise GatewayError(f"the gateway cannot bind {self.host}:{self.port}: {exc.strerror or exc}") from None
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(build_app(self), log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self.batcher.start()
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, name="rlx-gateway",
                                        daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise GatewayError(f"the gateway did not start on {self.host}:{self.port}")
            time.sleep(0.005)
        return self

    def stop(self) -> None:
        with self._lock:
            for session in self.sessions.values():
                session.closed = True
            self._open.clear()
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(30)
        self.batcher.stop()

    def __enter__(self) -> Gateway:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def base_url(self, sid: str | None = None) -> str:
        """What a harness gives its OpenAI client: /sessions/SID/v1 (or /v1: no session, nothing recorded)."""
        return f"{self.url}/sessions/{sid}/v1" if sid else f"{self.url}/v1"

    # ------------------------------------------------------------------ sessions
    def open_session(self, sid: str, sample_seed: int) -> Session:
        with self._lock:
            if sid in self.sessions:
                raise ValueError(f"session {sid} exists")
            session = self.sessions[sid] = Session(sid, sample_seed, self.limits, self.stop_id)
            self._open.add(sid)
            return session

    def close_session(self, sid: str) -> Session:
        """The episode ended: later calls get 410; returns the session with its rows."""
        with self._lock:
            session = self.sessions[sid]
            session.closed = True
            self._open.discard(sid)
            return session

    def session(self, sid: str | None) -> Session:
        """The session a request names; no name: a one-call session that is not kept (seeded at random)."""
        if sid is None:
            return Session("none", secrets.randbits(31), self.limits, self.stop_id)
        with self._lock:
            if sid not in self.sessions:
                if not self.settings.auto_sessions:
                    raise RequestError(f"no session {sid!r} (sessions are opened by the trainer)", status=404,
                                       code="session_not_found")
                self.sessions[sid] = Session(sid, secrets.randbits(31), self.limits, self.stop_id)
            return self.sessions[sid]

    def _waiting_for(self) -> int | None:
        """Open sessions: when that many requests wait, no other request can come before an answer."""
        count = len(self._open)
        return count or None

    # ------------------------------------------------------------------ requests
    def chat_renderer(self) -> ChatRenderer:
        if self.renderer is None:
            raise RequestError("the model has no chat template: set env.chat_template=FILE or call /v1/completions")
        return self.renderer

    def note_sampling(self, body: dict) -> None:
        """Log once per setting when a request asks for sampling other than rlx's (rlx's is used)."""
        for key, ours in self.sampling.items():
            theirs = body.get(key)
            if theirs is not None and key not in self._noted and theirs != ours:
                self._noted.add(key)
                log.warning("gateway: a request asks %s=%s; rlx samples with rollout.%s=%s (the trainer's own "
                            "sampling is used; logged once)", key, theirs, key, ours)
        cap = body.get("max_completion_tokens") or body.get("max_tokens")
        if isinstance(cap, int) and cap > self.limits.max_new_tokens and "max_tokens" not in self._noted:
            self._noted.add("max_tokens")
            log.warning("gateway: a request asks max_tokens=%d; env.max_new_tokens=%d caps every call (logged once)",
                        cap, self.limits.max_new_tokens)
