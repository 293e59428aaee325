"""rlx's configuration: where it lives (paths), the typed schemas (schema: the primary configs and the check;
groups and families: the dataclasses of the groups and of the algorithm families; fields: how a field declares
its type, range or choices), the cross-field rules (rules, seed_rules), the command line's overrides with one-line
errors (overrides), the names other libraries use (peer_names), the user's modules imported before a check
(plugins) and the registries they can add to, by kind (registries: `rlx.register`).

`rlx.config.UserError` is the exception the Python API raises for a user's mistake (kept here for user code).
"""

from rlx.errors import UserError

__all__ = ["UserError"]
