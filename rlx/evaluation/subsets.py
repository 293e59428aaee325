"""Seeded, stratified subsets of a benchmark's questions (`rlx eval subset=N`)."""

from __future__ import annotations

import numpy as np


def stratified_indices(strata: list[str], size: int, seed: int) -> list[int]:
    """`size` indices drawn without replacement, stratum by stratum: each stratum s of n_s items gets
    floor(size * n_s / n) places and the places left go to the strata with the largest fractional parts (largest
    remainder, ties by name), then a seeded draw inside each stratum. Sorted; size >= n returns every index."""
    if size >= len(strata):
        return list(range(len(strata)))
    members: dict[str, list[int]] = {}
    for index, stratum in enumerate(strata):
        members.setdefault(stratum, []).append(index)
    names = sorted(members)
    quotas = {name: size * len(members[name]) / len(strata) for name in names}
    counts = {name: int(quotas[name]) for name in names}
    by_remainder = sorted(names, key=lambda name: (-(quotas[name] - counts[name]), name))
    for name in by_remainder[: size - sum(counts.values())]:
        counts[name] += 1
    rng = np.random.default_rng(seed)
    return sorted(int(i) for name in names for i in rng.choice(members[name], size=counts[name], replace=False))
