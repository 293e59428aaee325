"""`rlx view`: a local page over run directories (fastapi + uvicorn, the gateway's stack), or the same page
exported as static files.

The page (rlx/view/static/) asks the JSON routes below; an export writes the answers of those routes into
data.js beside the page, and the page reads them from there (a page opened from disk cannot fetch).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import socket
from pathlib import Path

from rlx.errors import UserError
from rlx.report.runs import short_override
from rlx.view.data import (
    MetricsTail,
    ViewRun,
    config_diff,
    discover,
    group_metrics,
    run_config,
    samples_per_step,
    seed_bands,
)
from rlx.view.evals import eval_view
from rlx.view.health import health_flags
from rlx.view.samples import SamplesCache, sample_steps

STATIC = Path(__file__).parent / "static"
DOCS_URL = "http://127.0.0.1:8000"  # where `make docs-serve` serves the docs; --docs-url points elsewhere


def encode(payload) -> bytes:
    return json.dumps(payload, allow_nan=False, separators=(",", ":")).encode()


class Library:
    """The runs shown, their metrics read incrementally, their samples parsed once: what every route answers
    from. Runs are found again when asked (a sweep gains trials while it runs)."""

    def __init__(self, paths: list[Path], docs_url: str = DOCS_URL):
        self.paths = [Path(p) for p in paths]
        self.docs_url = docs_url.rstrip("/")
        self.tails: dict[Path, MetricsTail] = {}
        self.samples = SamplesCache()
        self.configs: dict[Path, tuple] = {}
        self.encoded: dict[Path, tuple[int, bytes]] = {}
        self.runs: dict[str, ViewRun] = {}
        self.notes: list[str] = []
        self.refresh()

    def refresh(self) -> None:
        runs, self.notes = discover(self.paths)
        known = {run.path: run for run in self.runs.values()}
        kept = [known.get(run.path, run) for run in runs]  # a run keeps its id once it was shown
        used = {run.id for run in kept if run.path in known}
        fresh = (f"r{i}" for i in range(len(kept) + len(self.runs) + 1) if f"r{i}" not in used)
        for run in kept:
            if run.path not in known:
                run.id = next(fresh)
                used.add(run.id)
        self.runs = {run.id: run for run in kept}

    def run(self, run_id: str) -> ViewRun:
        if run_id not in self.runs:
            self.refresh()
        if run_id not in self.runs:
            raise KeyError(run_id)
        return self.runs[run_id]

    def tail(self, run: ViewRun) -> MetricsTail:
        tail = self.tails.setdefault(run.path, MetricsTail(run.path / "metrics.jsonl"))
        tail.update()
        return tail

    def config(self, run: ViewRun) -> dict:
        """run_config, read again when config.yaml or env.json changes (a run that is starting writes them)."""
        stamp = tuple(path.stat().st_mtime_ns if path.is_file() else None
                      for path in (run.path / "config.yaml", run.path / "env.json"))
        if self.configs.get(run.path, (None,))[0] != stamp:
            self.configs[run.path] = (stamp, run_config(run))
        return self.configs[run.path][1]

    def seed_groups(self) -> list[dict]:
        """Training runs sharing a configuration (2 or more seeds): drawn as a mean with a band."""
        by_key: dict[tuple, list[ViewRun]] = {}
        for run in self.runs.values():
            if run.kind == "train":
                by_key.setdefault(run.config_group, []).append(run)
        groups = [runs for runs in by_key.values() if len(runs) > 1]
        keys = list(by_key)
        common = set(keys[0]).intersection(*keys[1:]) if keys else set()
        out = []
        for i, runs in enumerate(groups):  # labelled by what sets the group apart, as rlx report labels them
            differing = [min(o, short_override(o), key=len) for o in runs[0].config_group if o not in common]
            out.append({"id": f"g{i}",
                        "label": f"{' '.join(differing) + ': ' if differing else ''}mean of {len(runs)} seeds",
                        "runs": [r.id for r in runs]})
        return out

    # ------------------------------------------------------------------------------------------- routes
    def runs_payload(self) -> dict:
        self.refresh()
        out = []
        for run in self.runs.values():
            config = self.config(run)["config"]
            out.append({"id": run.id, "name": run.name, "path": str(run.path), "kind": run.kind, "seed": run.seed,
                        "overrides": run.overrides, "notes": run.notes, "samples_per_step": samples_per_step(config),
                        "live": _live(run.path)})
        return {"runs": out, "notes": self.notes, "groups": self.seed_groups(), "docs_url": self.docs_url}

    def metrics_payload(self, run_id: str, since: int = 0) -> dict:
        run = self.run(run_id)
        tail = self.tail(run)
        payload = tail.since(max(0, since))
        payload["groups"] = group_metrics(tail.names)
        payload["flags"] = [dataclasses.asdict(f) for f in health_flags(tail, self.config(run)["config"])]
        return payload

    def metrics_json(self, run_id: str, since: int = 0) -> bytes:
        """metrics_payload encoded; the whole run's (since 0, what a page asks first) is kept until the run grows,
        so opening or reloading the page sends it without reading or encoding 10,000 rows again."""
        run = self.run(run_id)
        rows = self.tail(run).rows
        if since == 0 and self.encoded.get(run.path, (None,))[0] == rows:
            return self.encoded[run.path][1]
        data = encode(self.metrics_payload(run_id, since))
        if since == 0:
            self.encoded[run.path] = (rows, data)
        return data

    def warm(self) -> None:
        """Read every training run's metrics now (before the URL is printed), not on the first page load."""
        for run in list(self.runs.values()):
            if run.kind == "train":
                self.metrics_json(run.id, 0)

    def bands_payload(self, group_id: str) -> dict:
        group = next((g for g in self.seed_groups() if g["id"] == group_id), None)
        if group is None:
            raise KeyError(group_id)
        tails = [self.tail(self.run(r)) for r in group["runs"]]
        names = set.intersection(*(set(t.names) for t in tails))
        return {"id": group_id, "label": group["label"], "runs": group["runs"],
                "bands": seed_bands(tails, sorted(names))}

    def steps_payload(self, run_id: str) -> dict:
        return {"steps": sample_steps(self.run(run_id).path)}

    def group_size(self, run: ViewRun) -> int | None:
        """Completions per prompt (rollout.samples_per_prompt): splits samples files that carry no group ids."""
        rollout = self.config(run)["config"].get("rollout")
        size = rollout.get("samples_per_prompt") if isinstance(rollout, dict) else None
        return size if isinstance(size, int) and size > 0 else None

    def samples_payload(self, run_id: str, step: int) -> dict:
        run = self.run(run_id)
        groups, notes = self.samples.groups(run.path, step, self.group_size(run))
        return {"step": step, "groups": groups, "notes": notes}

    def follow_payload(self, run_id: str, prompt: str) -> dict:
        run = self.run(run_id)
        return {"prompt": prompt, "steps": self.samples.follow(run.path, prompt, self.group_size(run))}

    def config_payload(self, run_id: str) -> dict:
        return self.config(self.run(run_id))

    def diff_payload(self, a: str, b: str) -> dict:
        return {"a": a, "b": b,
                "diff": config_diff(self.config(self.run(a))["config"], self.config(self.run(b))["config"])}

    def eval_payload(self, run_id: str) -> dict:
        return eval_view(self.run(run_id).path)


LIVE_SECONDS = 120  # a run whose metrics.jsonl changed this recently, without result.json or failure.json


def _live(run_dir: Path) -> bool:
    """Whether a run looks like it is still training (the page marks it; it polls every run anyway). The run's
    lock is not tried: holding it even briefly could refuse a trainer starting at that moment."""
    import time

    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file() or any((run_dir / name).is_file() for name in ("result.json", "failure.json")):
        return False
    return time.time() - metrics.stat().st_mtime < LIVE_SECONDS


def create_app(library: Library):
    """The ASGI app: the page's files and its JSON routes. An unknown run is a 404 naming it."""
    from fastapi import FastAPI, HTTPException
    from fastapi.responses import FileResponse, Response
    from fastapi.staticfiles import StaticFiles

    app = FastAPI(title="rlx view", docs_url=None, redoc_url=None, openapi_url=None)

    def answer(fn, *args):
        """fn's payload as JSON; encoded here, not by fastapi's jsonable_encoder (which walks every value in
        Python: 0.7 s for 10,000 steps of metrics, longer than reading them)."""
        try:
            payload = fn(*args)
            return Response(payload if isinstance(payload, bytes) else encode(payload), media_type="application/json")
        except KeyError as exc:
            raise HTTPException(404, f"no run or group {exc.args[0]} (the page lists the runs found)") from None
        except FileNotFoundError as exc:
            raise HTTPException(404, f"{exc.filename} is gone") from None

    # typed parameters: fastapi converts and checks them (a step that is not a number is a 422)
    @app.get("/api/runs")
    def runs():
        return answer(library.runs_payload)

    @app.get("/api/metrics/{run_id}")
    def metrics(run_id: str, since: int = 0):
        return answer(library.metrics_json, run_id, since)

    @app.get("/api/bands/{group_id}")
    def bands(group_id: str):
        return answer(library.bands_payload, group_id)

    @app.get("/api/samples/{run_id}")
    def steps(run_id: str):
        return answer(library.steps_payload, run_id)

    @app.get("/api/samples/{run_id}/{step}")
    def samples(run_id: str, step: int):
        return answer(library.samples_payload, run_id, step)

    @app.get("/api/follow/{run_id}")
    def follow(run_id: str, prompt: str):
        return answer(library.follow_payload, run_id, prompt)

    @app.get("/api/config/{run_id}")
    def config(run_id: str):
        return answer(library.config_payload, run_id)

    @app.get("/api/diff/{a}/{b}")
    def diff(a: str, b: str):
        return answer(library.diff_payload, a, b)

    @app.get("/api/eval/{run_id}")
    def evaluation(run_id: str):
        return answer(library.eval_payload, run_id)

    app.get("/")(lambda: FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"}))
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app


def export(library: Library, out: Path) -> Path:
    """The page as static files in `out` (index.html, static/, data.js with every route's answer): it opens from
    disk, without a server, for sharing. Follow-a-prompt is computed in the page from the exported samples."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if (out / "static").exists():
        shutil.rmtree(out / "static")
    shutil.copytree(STATIC, out / "static")
    data: dict[str, object] = {"/api/runs": library.runs_payload()}
    for run in library.runs.values():
        rid = run.id
        data[f"/api/config/{rid}"] = library.config_payload(rid)
        if run.kind == "eval":
            data[f"/api/eval/{rid}"] = library.eval_payload(rid)
            continue
        data[f"/api/metrics/{rid}?since=0"] = library.metrics_payload(rid, 0)
        steps = library.steps_payload(rid)
        data[f"/api/samples/{rid}"] = steps
        for step in steps["steps"]:
            data[f"/api/samples/{rid}/{step}"] = library.samples_payload(rid, step)
    for group in library.seed_groups():
        data[f"/api/bands/{group['id']}"] = library.bands_payload(group["id"])
    ids = list(library.runs)
    for a in ids:
        for b in ids:
            if a != b:
                data[f"/api/diff/{a}/{b}"] = library.diff_payload(a, b)
    (out / "data.js").write_text("window.RLX_EXPORT = " + json.dumps(data, allow_nan=False) + ";\n", encoding="utf-8")
    page = (STATIC / "index.html").read_text(encoding="utf-8")
    page = page.replace('<script src="static/app.js"></script>',
                        '<script src="data.js"></script>\n<script src="static/app.js"></script>')
    (out / "index.html").write_text(page, encoding="utf-8")
    return out / "index.html"


def free_socket(port: int = 0) -> socket.socket:
    """A listening-ready socket on 127.0.0.1 (port 0: one the OS picks)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError as exc:
        sock.close()
        raise UserError(f"--port {port}: {exc.strerror}; pass another port or leave --port out (the OS picks "
                        "one)") from None
    return sock


def serve(library: Library, port: int = 0) -> None:
    import uvicorn

    sock = free_socket(port)
    library.warm()
    host, bound = sock.getsockname()
    print(f"rlx view: http://{host}:{bound}/  ({len(library.runs)} run(s); Ctrl-C stops)", flush=True)
    config = uvicorn.Config(create_app(library), log_level="warning", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="rlx view",
        description="A local page over run, eval and sweep directories: curves, samples, eval results, health flags, "
                    "configs. It updates while a run trains.")
    parser.add_argument("dirs", nargs="*", type=Path, default=None,
                        help="run, eval or sweep directories (default: outputs/, or $RLX_OUTPUTS)")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: one the OS picks)")
    parser.add_argument("--export", type=Path, default=None, metavar="DIR",
                        help="write the page as static files into DIR (opens from disk) instead of serving it")
    parser.add_argument("--docs-url", default=DOCS_URL,
                        help=f"where the health flags' links point (default: {DOCS_URL}, "
                                                             f"what `make docs-serve` serves)")
    args = parser.parse_args(argv)
    import os

    dirs = args.dirs or [Path(os.environ.get("RLX_OUTPUTS", "outputs"))]
    for path in dirs:
        if not path.is_dir():
            raise UserError(f"'{path}' is not a directory; pass run, eval or sweep directories written by rlx train / "
                            "rlx eval")
    library = Library(dirs, args.docs_url)
    if args.export is not None:
        print(f"rlx view: {export(library, args.export)} ({len(library.runs)} run(s); open it in a browser)")
        return
    serve(library, args.port)
