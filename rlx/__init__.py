"""rlx: RL post-training of language models from the command line (`rlx --help`) or Python.

    import rlx
    result = rlx.fit(overrides=["steps=2"], rewards=[my_reward])   # -> RunResult(run_dir, metrics)
    rlx.evaluate(overrides=[f"run={result.run_dir}"])

The Python entry points load lazily, so `import rlx` (and `rlx --version`) stays fast.
"""

__version__ = "0.1.0"

__all__ = ["__version__", "fit", "evaluate"]


def __getattr__(name: str):
    if name in ("fit", "evaluate", "RunResult"):
        from rlx import api

        return getattr(api, name)
    raise AttributeError(f"module 'rlx' has no attribute {name!r}")
