"""rlx: RL post-training of language models from the command line (`rlx --help`) or Python.

    import rlx
    result = rlx.fit(overrides=["steps=2"], rewards=[my_reward])   # -> RunResult(run_dir, metrics)
    rlx.evaluate(overrides=[f"run={result.run_dir}"])

    @rlx.register("advantage", "my_mean")                           # a plugin's entry (docs/extending/plugins.md)
    def my_mean(rewards, group_ids, **knobs): ...

The Python entry points load lazily, so `import rlx` (and `rlx --version`) stays fast.
"""

from rlx.version import __version__

__all__ = ["__version__", "fit", "evaluate", "register"]


def __getattr__(name: str):
    if name in ("fit", "evaluate", "register", "RunResult"):
        import rlx.api

        return getattr(rlx.api, name)
    raise AttributeError(f"module 'rlx' has no attribute {name!r}")
