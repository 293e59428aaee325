"""rlx's configuration: where it lives (paths), the typed schemas (schema), the cross-field rules (rules), the
command line's overrides with one-line errors (overrides), and the names other libraries use (peer_names).

`rlx.config.UserError` is the exception the Python API raises for a user's mistake (kept here for user code).
"""

from rlx.errors import UserError

__all__ = ["UserError"]
