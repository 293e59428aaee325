"""Several processes, one run: `rlx train hardware=ddp hardware.num_processes=N` launches itself.

The parent process composes the config, creates the run directory and writes its files, then starts
the workers with Accelerate's launcher (`python -m accelerate.commands.launch ... -m rlx train ...`),
passing the run directory explicitly (`hydra.run.dir=<run>`, and RLX_RUN_DIR in the environment), so
every rank writes into the same directory. Only the main process logs, evaluates, checkpoints and
shows progress.

Also here: the global batch arithmetic checked at start-up, and `resume=` turned into the run
directory to continue.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import yaml

from rlx.errors import UserError, fail

log = logging.getLogger("rlx")

WORKER_ENV = "RLX_RUN_DIR"  # set in workers started by `launch_workers`: the shared run directory
ERRORS_ENV = "RLX_WORKER_ERRORS"  # a folder where workers and the launcher record why they stopped (read by the parent)
# a collective that failed because another process of the run died: that process's error is the one to show
PEER_FAILURE_MARKS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Socket Timeout",
                      "connection reset", "closed by remote")


def world_size(hardware) -> int:
    return int(hardware.num_processes) * int(hardware.num_machines)


def is_worker() -> bool:
    return os.environ.get(WORKER_ENV) is not None


def check_not_externally_launched() -> None:
    """`accelerate launch -m rlx train` / `torchrun -m rlx train` with several processes: stop with one line.

    rlx starts its own workers (so that they share one run directory and the parent can resume them);
    a rank started by another launcher would instead create its own run directory, or, with
    hardware=ddp, launch a second set of processes. Rank 0 prints the line; every rank exits 2."""
    if is_worker() or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    if os.environ.get("RANK", "0") == "0":
        print(f"error: rlx starts its own processes; instead of an external launcher with {os.environ['WORLD_SIZE']} "
              f"processes run `rlx train hardware=ddp hardware.num_processes={os.environ['WORLD_SIZE']}` "
              f"(or hardware=fsdp / deepspeed_zero2, see docs/scaling/index.md)", file=sys.stderr)
    raise SystemExit(2)


def needs_launch(hardware) -> bool:
    """True in the parent of a multi-process run (the workers have RLX_RUN_DIR set). FSDP is launched even
    with one process: FSDP2 shards over a process group, which only the launcher's workers have."""
    return (world_size(hardware) > 1 or getattr(hardware, "distributed", None) == "fsdp") and not is_worker()


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launcher_command(hardware, worker_args: list[str]) -> list[str]:
    """`python -m accelerate.commands.launch <strategy flags> -m rlx <worker_args>`."""
    port = hardware.main_process_port if hardware.num_machines > 1 else _free_port()
    cmd = [sys.executable, "-m", "accelerate.commands.launch",
           "--num_processes", str(world_size(hardware)), "--num_machines", str(hardware.num_machines),
           "--machine_rank", str(hardware.machine_rank), "--main_process_port", str(port),
           "--mixed_precision", str(hardware.mixed_precision), "--dynamo_backend", "no"]
    if hardware.num_machines > 1:
        if not getattr(hardware, "main_process_ip", None):
            raise UserError("hardware.main_process_ip is required with several machines: the address of machine 0")
        cmd += ["--main_process_ip", str(hardware.main_process_ip)]
    strategy = getattr(hardware, "distributed", None) or "ddp"
    if strategy == "fsdp":
        fsdp = hardware.fsdp
        # the workers build the same plugin from the config (rlx.runtime.parallel.fsdp_plugin); the flags tell the
        # launcher
        cmd += ["--use_fsdp", "--fsdp_version", str(fsdp.version),
                "--fsdp_reshard_after_forward", str(bool(fsdp.reshard_after_forward)).lower(),
                "--fsdp_auto_wrap_policy", str(fsdp.auto_wrap_policy), "--fsdp_state_dict_type",
                str(fsdp.state_dict_type), "--fsdp_offload_params", str(bool(fsdp.cpu_offload)).lower()]
    elif strategy == "deepspeed":
        ds = hardware.deepspeed
        cmd += ["--use_deepspeed", "--zero_stage", str(ds.zero_stage),
                "--offload_optimizer_device", str(ds.offload_optimizer_device),
                "--offload_param_device", str(ds.offload_param_device),
                "--zero3_init_flag", str(bool(ds.zero3_init_flag)).lower()]
    elif strategy in ("ddp", "no"):
        cmd += ["--multi_gpu"]  # torch elastic launcher: N processes; gloo when no GPU is visible
    else:
        raise UserError(f"unknown hardware.distributed '{strategy}'; valid choices: no, ddp, fsdp, deepspeed")
    cmd += [str(a) for a in getattr(hardware, "launcher_args", None) or []]
    return cmd + ["-m", "rlx", *worker_args]


def launch_workers(hardware, run_dir: Path, overrides: list[str]) -> int:
    """Start world_size workers on this machine's share; returns the exit code of the run.

    A failing worker stops the whole run (the launcher ends the others) and the run ends with one `error:` line:
    workers do not print their errors but record them (`record_worker_error`), a worker that only saw another one
    die records nothing, and this process prints each distinct recorded error once (a NaN found on every rank is
    one line), or, when a worker died without a word (killed), which rank died how. SIGTERM to this process is
    passed on to the launcher (the workers checkpoint and stop), and the launcher gets SIGTERM should this
    process die, so no worker outlives the run."""
    import tempfile

    quoted = str(run_dir).replace("'", "\\'")
    worker_args = ["train", *overrides, f"hydra.run.dir='{quoted}'", "hydra.output_subdir=null"]
    cmd = launcher_command(hardware, worker_args)
    errors = Path(tempfile.mkdtemp(prefix="rlx-worker-errors-"))
    env = dict(os.environ, **{WORKER_ENV: str(run_dir), ERRORS_ENV: str(errors)})
    if getattr(hardware, "distributed", None) == "deepspeed" and not _cuda_available():
        env.setdefault("DS_ACCELERATOR", "cpu")  # DeepSpeed's CPU accelerator (gloo) when no GPU is visible
    if hardware.num_threads:
        env["OMP_NUM_THREADS"] = str(hardware.num_threads)
    log.info("launching %d processes: %s", world_size(hardware), " ".join(cmd))
    # Ctrl-C reaches the launcher and the workers from the terminal; the workers finish their step and
    # checkpoint, so this process only waits for them instead of killing the launcher. SIGTERM reaches only
    # this process: it is passed on to the launcher, which passes it to the workers.
    interrupted = []
    proc = None

    def wait_for_workers(signum, frame):
        interrupted.append(signum)
        if signum == signal.SIGTERM and proc is not None:
            proc.send_signal(signal.SIGTERM)
        log.warning("waiting for the workers to checkpoint")

    previous = {sig: signal.signal(sig, wait_for_workers) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        # run in-process by the wrapper at the end of this file: accelerate's launcher without its traceback
        proc = subprocess.Popen([cmd[0], "-m", "rlx.runtime.launch", *cmd[3:]], env=env, preexec_fn=_term_with_parent)
        code = proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if proc is not None and proc.poll() is None:
            proc.kill()
    try:
        if code and not interrupted:
            code = _report_worker_errors(errors, code, run_dir)
    finally:
        import shutil

        shutil.rmtree(errors, ignore_errors=True)
    return 130 if interrupted and code else code  # the launcher reports the workers' exit 130 as a failure


def _term_with_parent() -> None:
    """In the launcher before exec: SIGTERM when the rlx process that started it dies (even by SIGKILL)."""
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


def record_worker_error(message: str | None, code: int) -> None:
    """In a worker: record why it stops (message None: another process failed first) for the parent to print."""
    import json

    folder = os.environ.get(ERRORS_ENV)
    if not folder:
        if message:
            print(f"error: {message}", file=sys.stderr)
        return
    rank = os.environ.get("RANK", "0")
    Path(folder, f"rank{rank}.json").write_text(json.dumps({"rank": int(rank), "code": code, "message": message}))


def is_peer_failure(exc: BaseException) -> bool:
    """Whether `exc` (or one it came from) is a collective that failed because another process died."""
    while exc is not None:
        if type(exc).__name__ == "DistBackendError" or any(m in str(exc) for m in PEER_FAILURE_MARKS):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _report_worker_errors(errors: Path, code: int, run_dir: Path) -> int:
    """Print each distinct recorded worker error once (or what killed a silent worker) and the resume command;
    returns the exit code of the run (the first recorded error's, else the launcher's)."""
    import json

    from rlx.runtime.checkpoint import latest_checkpoint

    records = sorted((json.loads(p.read_text()) for p in errors.glob("*.json")), key=lambda r: r["rank"])
    messages = [r for r in records if r.get("message")]
    shown = []
    for record in messages:
        if record["message"] not in shown:
            shown.append(record["message"])
            print(f"error: {record['message']}", file=sys.stderr)
    if shown:
        code = messages[0]["code"]
    else:
        died = [r for r in records if "exitcode" in r and r["exitcode"]]
        what = ", ".join(f"rank {r['rank']} " + (f"was killed by signal {-r['exitcode']}" if r["exitcode"] < 0
                                                  else f"exited with code {r['exitcode']}") for r in died)
        print(f"error: a worker process stopped without an error message ({what or f'launcher exit code {code}'}); "
              f"see {run_dir / 'train.log'}", file=sys.stderr)
    if code != 2:  # not a refused setting: the run may have checkpoints to continue from
        found = latest_checkpoint(run_dir)
        if found is not None:
            print(f"checkpoints up to step {found[0]} are intact; continue with: rlx train resume={run_dir}",
                  file=sys.stderr)
    return code


def outputs_root() -> Path:
    return Path(os.environ.get("RLX_OUTPUTS", "outputs")) / "train"


def resolve_resume(args: list[str]) -> list[str]:
    """`resume=<run dir>` or `resume=auto` -> the run's saved overrides, the new ones, `hydra.run.dir=<run>`.

    The saved overrides come first and the command line's replace those with the same key, so
    `rlx train resume=<run> steps=500` continues the same run for longer."""
    given = [a for a in args if a.startswith("resume=")]
    if not given or is_worker():  # workers get the parent's resolved overrides and run directory
        return args
    value = given[-1].split("=", 1)[1].strip("'\"")
    if value in ("null", ""):
        return args
    if value == "auto":
        from rlx.config.overrides import check_overrides

        name = check_overrides([a for a in args if not a.startswith("resume=")]).name
        from rlx.runtime.checkpoint import latest_checkpoint

        # the latest run of that name that has a checkpoint (a run that crashed before its first one has nothing to
        # resume)
        runs = sorted(p for p in outputs_root().glob(f"*_{name}") if (p / "config.yaml").is_file()
                      and latest_checkpoint(p))
        if not runs:
            print(f"resume=auto: no earlier run named '{name}' with a checkpoint under {outputs_root()}; starting a "
                  "new one",
                  file=sys.stderr)
            return [a for a in args if not a.startswith("resume=")]
        run = runs[-1]
    else:
        run = Path(value).expanduser()
        if not (run / "config.yaml").is_file():
            fail(f"resume={value} is not a run directory (no config.yaml); pass a run directory or resume=auto")
        try:  # read again at the end of the resume (the record of what changed): a damaged one must stop it now
            from omegaconf import DictConfig, OmegaConf

            if not isinstance(OmegaConf.load(run / "config.yaml"), DictConfig):
                raise ValueError("not a mapping of settings")
        except Exception as exc:
            fail(f"{run / 'config.yaml'} is damaged ({(str(exc).strip().splitlines() or [type(exc).__name__])[0]}); "
                 "the run cannot be resumed as it was")
    from rlx.errors import RunInUse
    from rlx.runtime.rundir import check_run_free

    try:
        check_run_free(run)
    except RunInUse as exc:
        fail(str(exc))
    try:
        saved = yaml.safe_load((run / "overrides.yaml").read_text()) or [] if (run / "overrides.yaml").is_file() else []
    except yaml.YAMLError as exc:
        fail(f"{run / 'overrides.yaml'} is damaged ({str(exc).splitlines()[0]}); the run cannot be resumed as it was")
    new = [a for a in args if not a.startswith("resume=")]
    new_keys = {a.split("=", 1)[0].lstrip("+~") for a in new}
    kept = [o for o in saved if o.split("=", 1)[0].lstrip("+~") not in new_keys
            and not o.startswith(("resume=", "hydra."))]
    kept = [o for o in kept if o not in unread_knobs(run, kept)]
    kept += legacy_pins(run, new_keys)
    if new:
        check_resume_compatible(run, [*kept, *new])
    quoted = str(run.resolve()).replace("'", "\\'")
    return [*kept, *new, f"resume='{quoted}'", f"hydra.run.dir='{quoted}'"]


def unread_knobs(run: Path, overrides: list[str]) -> list[str]:
    """Saved overrides of knobs the run's own family (backend) never read: before each algorithm family got
    only its own knobs (grpo.yaml carried PPO's critic knobs), a grpo run could be given `algorithm.vf_coef=...`;
    it had no effect, and the family's schema now refuses it, so a resume leaves it out."""
    candidates = [o for o in overrides if o.lstrip("+~").startswith(("algorithm.", "rollout."))]
    if not candidates:
        return []
    try:
        saved = yaml.safe_load((run / "config.yaml").read_text()) or {}
    except yaml.YAMLError:
        return []  # check_resume_compatible reports the damaged file
    from rlx.config.schema import DISPATCH, Algorithm, Rollout, owners, schema_fields

    unread = []
    for text in candidates:
        group, _, key = text.lstrip("+~").split("=", 1)[0].partition(".")
        base = {"algorithm": Algorithm, "rollout": Rollout}[group]
        choice_key, table = DISPATCH[base]
        schema = table.get((saved.get(group) or {}).get(choice_key)) if isinstance(saved.get(group), dict) else None
        if schema is not None and "." not in key and key not in schema_fields(schema) and owners(base, key):
            unread.append(text)
    return unread


# knobs whose default changed after runs were made without them: the value such a run used. A resume of a run
# whose config.yaml lacks the key pins it (rollout.sampler: v2 became the default; older runs drew with v1)
LEGACY_DEFAULTS = {"rollout.sampler": "v1"}


def legacy_pins(run: Path, new_keys: set[str]) -> list[str]:
    """`++key=value` overrides that keep a resumed run on the LEGACY_DEFAULTS its config.yaml predates."""
    try:
        saved = yaml.safe_load((run / "config.yaml").read_text()) or {}
    except yaml.YAMLError:
        return []  # check_resume_compatible reports the damaged file
    pins = []
    for dotted, value in LEGACY_DEFAULTS.items():
        *parents, key = dotted.split(".")
        node = saved
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        # the group exists (the run has a rollout) but predates the key
        if isinstance(node, dict) and key not in node and dotted not in new_keys:
            pins.append(f"++{dotted}={value}")
    return pins


# settings a resumed run cannot change: its checkpoints hold weights and states made under them
FIXED_ON_RESUME = ("algorithm.family", "model.path", "model.build", "model.lora.enabled", "seed")


def check_resume_compatible(run: Path, overrides: list[str]) -> None:
    """Refuse (one line, exit 2, nothing in the run rewritten) a resume that changes a fixed setting."""
    from omegaconf import OmegaConf

    from rlx.config.overrides import check_overrides

    new = OmegaConf.to_container(check_overrides(overrides), resolve=True)
    old = OmegaConf.to_container(OmegaConf.load(run / "config.yaml"), resolve=True)

    missing = object()

    def get(cfg, dotted):
        for part in dotted.split("."):
            cfg = cfg.get(part, missing) if isinstance(cfg, dict) else missing
        return cfg

    for key in FIXED_ON_RESUME:
        if get(old, key) is not missing and get(old, key) != get(new, key):
            fail(f"resume cannot change {key} (the run has {get(old, key)!r}, the command asks for {get(new, key)!r}): "
                 f"the checkpoints were made under it; start a new run instead (drop resume=), or drop {key}=")


def _run_launcher_quietly() -> None:
    """`python -m rlx.runtime.launch <accelerate launch arguments>`: Accelerate's launcher, but a failed worker ends it
    with its exit code and a record for the parent instead of a traceback (the parent prints one line)."""
    import json
    import logging as _logging

    from accelerate.commands.launch import main as accelerate_launch
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    _logging.getLogger("torch.distributed.elastic").setLevel(_logging.CRITICAL)  # per-worker noise; the parent says it
    try:
        accelerate_launch()
    except ChildFailedError as exc:
        first = exc.get_first_failure()[1]
        folder = os.environ.get(ERRORS_ENV)
        if folder:
            for rank, failure in exc.failures.items():
                Path(folder, f"launcher-rank{rank}.json").write_text(
                    json.dumps({"rank": rank, "exitcode": failure.exitcode}))
        raise SystemExit(first.exitcode if first.exitcode > 0 else 1) from None


if __name__ == "__main__":
    _run_launcher_quietly()
