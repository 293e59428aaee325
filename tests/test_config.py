"""Every shipped config composes, and user mistakes give one line and exit code 2."""

import pytest

from rlx.config.overrides import check_overrides
from rlx.config.paths import RECIPES_DIR, config_groups, group_options
from tests.conftest import run_rlx

# those are _global_
GROUP_OPTIONS = [(g, o) for g in config_groups() if g not in ("recipes", "sweep", "tuning") for o in group_options(g)]


@pytest.mark.parametrize("group,option", GROUP_OPTIONS, ids=[f"{g}={o}" for g, o in GROUP_OPTIONS])
def test_every_group_option_composes(group, option):
    extra = []
    if group == "data" and option == "file":
        extra = ["data.train_path=x.jsonl"]
    if group == "data" and option == "hub":
        extra = ["data.id=org/name"]
    config_name = "eval" if group in ("benchmark", "suite") else "train"  # benchmarks and suites belong to `rlx eval`
    cfg = check_overrides([f"{group}={option}", *extra], config_name=config_name)
    assert cfg[group] is not None


@pytest.mark.parametrize("recipe", sorted(p.stem for p in RECIPES_DIR.glob("*.yaml")))
def test_every_recipe_composes_and_states_its_command(recipe):
    text = (RECIPES_DIR / f"{recipe}.yaml").read_text()
    assert text.startswith("# @package _global_")
    assert f"rlx train {recipe}" in text and "Expected" in text
    check_overrides([f"recipes={recipe}"])


@pytest.mark.parametrize(
    "args,needle",
    [
        (["train", "algorithm=grpoo"], "unknown algorithm 'grpoo' (did you mean 'grpo'?); valid choices:"),
        (["train", "optim.lrr=1"], "unknown key 'optim.lrr' (did you mean 'optim.lr'?)"),
        (["train", "no_such_recipe"], "unknown recipe 'no_such_recipe'"),
        (["train", "-m", "algorithm=grpo,grpoo"], "unknown algorithm 'grpoo'"),
        (["frobnicate"], "unknown command 'frobnicate'"),
    ],
)
def test_user_mistakes_exit_2_with_one_line(tmp_path, args, needle):
    result = run_rlx(args, tmp_path, timeout=120)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert needle in lines[0]
    assert "Traceback" not in result.stderr


def test_help_and_cfg_job(tmp_path):
    top = run_rlx(["--help"], tmp_path, timeout=60)
    assert top.returncode == 0 and "train" in top.stdout
    helped = run_rlx(["train", "--help"], tmp_path, timeout=120)
    assert helped.returncode == 0
    for group in ("model", "algorithm", "reward", "data", "rollout", "hardware", "logger", "recipes"):
        assert f"{group}:" in helped.stdout
    job = run_rlx(["train", "algorithm=grpo", "seed=3", "+extra_key=1", "--cfg", "job"], tmp_path, timeout=120)
    assert job.returncode == 0, job.stderr
    assert "seed: 3" in job.stdout and "extra_key: 1" in job.stdout
    assert not (tmp_path / "outputs").exists()


def test_tab_completion(tmp_path):
    script = run_rlx(["-sc", "install=bash"], tmp_path, timeout=120)
    assert script.returncode == 0 and "complete -o nospace -o default -F hydra_bash_completion rlx" in script.stdout
    query = run_rlx(["-sc", "query=bash"], tmp_path, timeout=120,
                    env_extra={"COMP_LINE": "rlx train algorithm=", "COMP_POINT": "20"})
    assert "algorithm=grpo" in query.stdout.split()
    top = run_rlx(["-sc", "query=bash"], tmp_path, timeout=120, env_extra={"COMP_LINE": "rlx tr", "COMP_POINT": "6"})
    assert top.stdout.split() == ["train"]
