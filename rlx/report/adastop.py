"""AdaStop: a sequential test of whether configurations differ, deciding how many seeds are enough.

Mathieu et al. 2024, "AdaStop: adaptive statistical testing for sound comparisons of Deep RL agents"
(arXiv 2306.10882; seed listing 002). At interim k = 1..K every configuration still under comparison has
k * n runs; a group-sequential permutation test on the difference of mean scores (step-down over the
pairs, level alpha spent evenly over the K interims, family-wise error controlled) decides each pair:
"larger" / "smaller" (the first configuration's scores are higher / lower), "equal" (never rejected by
the last interim), or "continue" (undecided: run n more seeds of the configurations concerned).

rlx does not reimplement the test: it feeds the package of the paper's authors (`adastop`, pinned as the
optional extra rlx[stats]) with the final scores of each configuration's runs in seed order, interim by
interim, and stops at the first interim some configuration has not reached yet.
"""

from __future__ import annotations

import numpy as np

from rlx.errors import UserError


def adastop_compare(scores: dict[str, list[float]], n: int = 5, K: int = 5, alpha: float = 0.05, B: int = 10000,
                    seed: int = 0) -> dict:
    """Run AdaStop's interims on the runs available. scores: configuration -> final scores in seed order
    (at least 2 configurations). Returns {decisions: {"A vs B": decision}, interims: interims completed,
    finished: every pair decided, needs: {configuration: more seeds needed for the next interim}}."""
    try:
        from adastop import MultipleAgentsComparator
    except ImportError:
        raise UserError("--adastop needs the adastop package: pip install 'rlx[stats]' (adastop==0.1.3)") from None
    if len(scores) < 2:
        raise UserError(f"--adastop compares configurations: found {len(scores)} ({', '.join(scores) or 'none'})")
    if n < 1 or K < 1:
        raise UserError(f"--adastop n={n} K={K}: both must be at least 1")
    names = list(scores)
    values = {name: np.asarray(scores[name], dtype=float) for name in names}
    comparator = MultipleAgentsComparator(n=n, K=K, B=B, alpha=alpha, seed=seed)
    needs: dict[str, int] = {}
    interims = 0
    for k in range(K):
        active = names if k == 0 else sorted({names[i] for pair in comparator.current_comparisons for i in pair})
        wanted = (k + 1) * n
        needs = {name: wanted - values[name].size for name in active if values[name].size < wanted}
        if needs:
            break
        comparator.partial_compare({name: values[name][: min(values[name].size, wanted)] for name in names},
                                   verbose=False)
        interims = k + 1
        if comparator.is_finished:
            break
    decisions = {}
    if comparator.agent_names is not None:
        for i, j in comparator.comparisons:
            decisions[f"{names[i]} vs {names[j]}"] = comparator.decisions[str(np.array([i, j]))]
    else:  # not even the first interim could run
        decisions = {f"{a} vs {b}": "continue" for idx, a in enumerate(names) for b in names[idx + 1:]}
    return {"decisions": decisions, "interims": interims, "finished": bool(comparator.is_finished), "needs": needs}
