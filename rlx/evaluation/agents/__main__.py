"""`python -m rlx.evaluation.agents`: the alias of `rlx eval env=...` (rlx/cli/agents.py reads its arguments).
An entry point only: no module imports this one, so its import of the command line makes no cycle."""

from rlx.cli.agents import main

raise SystemExit(main())
