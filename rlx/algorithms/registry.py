"""Moved to rlx/registry.py (a leaf every layer may import). Kept only for rlx/rollout/replay.py and
rlx/rollout/temperature.py, which import it from here until their next rewrite; new code imports rlx.registry."""

from rlx.registry import Registry

__all__ = ["Registry"]
