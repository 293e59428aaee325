"""Settings are born at the command boundary (issue 36 item 5): each command turns its composed config into typed
settings once (rlx.config.settings.checked_settings), the cross-field rules check those settings, and everything
after reads them; the composed DictConfig is kept only as the run's record (config.yaml, overrides)."""

import ast
import inspect
from pathlib import Path

import pytest

import rlx.cli.gateway
import rlx.cli.training
import rlx.evaluation.runner
from rlx.config.overrides import check_overrides
from rlx.config.schema import EvalConfig, TrainConfig
from rlx.errors import UserError

RULE_MODULES = ["rlx/config/rules.py", "rlx/config/seed_rules.py", "rlx/config/async_rules.py", "rlx/config/needs.py"]
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("path", RULE_MODULES)
def test_the_rules_never_see_a_composed_config(path):
    """No rule module names OmegaConf's containers or selects a key by its dotted path: a rule reads the typed
    settings' attributes."""
    tree = ast.parse((ROOT / path).read_text())
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    names |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names}
    assert not names & {"DictConfig", "ListConfig", "OmegaConf"}, path


def _config_takers(module) -> set[str]:
    """The functions of `module` with a parameter annotated DictConfig (the composed config)."""
    found = set()
    for name, fn in inspect.getmembers(module, inspect.isfunction):
        if fn.__module__ == module.__name__ and any("DictConfig" in str(p.annotation)
                                                    for p in inspect.signature(fn).parameters.values()):
            found.add(name)
    return found


def test_only_the_command_fronts_take_the_composed_config():
    """`rlx train`: check_run makes the settings and run hands them on; `rlx eval`: the settling of a resume and
    the run's sampling (config-level), then check_settings makes the settings; `rlx gateway`: none past main."""
    assert _config_takers(rlx.cli.training) == {"check_run", "run"}
    assert _config_takers(rlx.evaluation.runner) == {"check_settings", "evaluate", "_settled_config", "_saved_config"}
    assert _config_takers(rlx.cli.gateway) == set()
    hints = inspect.signature(rlx.cli.training._run_locked).parameters
    assert "cfg" not in hints and "command" in hints


def test_check_run_returns_the_typed_settings_the_run_reads():
    """The front door gives back the dataclasses: the family's algorithm section and the backend's rollout section."""
    s = rlx.cli.training.check_run(check_overrides(["rollout=server", "rollout.server.urls=[http://127.0.0.1:9]"]))
    assert isinstance(s, TrainConfig)
    assert type(s.algorithm).__name__ == "PolicyGradient" and type(s.rollout).__name__ == "ServerRollout"
    assert s.rollout.server.urls == ["http://127.0.0.1:9"] and not hasattr(s, "get")
    with pytest.raises(UserError, match="optim.lr=0 is not valid"):  # the knobs are checked before they become settings
        rlx.cli.training.check_run(check_overrides(["optim.lr=0"]))


def test_eval_check_returns_typed_settings():
    s = rlx.evaluation.runner.check_settings(check_overrides(["benchmark=chain_sum", "sampling.n=2"], "eval"))
    assert isinstance(s, EvalConfig) and s.sampling.n == 2 and isinstance(s.benchmark["chain_sum"], dict)
    with pytest.raises(UserError, match="generates nothing"):
        rlx.evaluation.runner.check_settings(check_overrides(["benchmark=chain_sum", "sampling.n=0",
                                                              "sampling.greedy=false"], "eval"))
