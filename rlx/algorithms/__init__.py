"""The math of rlx: pure functions on tensors (torch and the standard library only, plus the leaf modules
rlx.registry and rlx.errors), each variant registered by name (`@REGISTRY.register("name")`).

Importing any module of this package runs this file first: it imports agent_credit.py, whose credit rules
register into rlx.algorithms.gigpo.CREDIT after GiGPO's own, so the registry always holds all of them in one
order (trajectory, gigpo, turn, loo, gra, hgpo), whichever module a caller imported.
"""

from rlx.algorithms import agent_credit  # noqa: F401  (registers loo, gra, hgpo)
