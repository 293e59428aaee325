"""The README's commands that do not train run verbatim on a fresh clone (scripts/readme_commands.py --quick);
the full run, trainings shortened, is `make readme-commands`."""

import subprocess
import sys

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
import readme_commands  # noqa: E402


def test_commands_are_parsed_from_bash_blocks_only(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("```bash\nrlx train a=1   # comment\nrlx train b=2 \\\n   c=3\n# only a comment\n```\n"
                      "```\n$ rlx train algorithm=grpoo\n```\n")
    assert readme_commands.readme_commands(readme) == ["rlx train a=1", "rlx train b=2 c=3"]


@pytest.mark.skipif(not (REPO / ".git").exists(), reason="needs a git checkout to clone")
def test_quick_readme_commands_pass_on_a_fresh_clone():
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "readme_commands.py"), "--quick"], capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    summary = [line for line in result.stdout.splitlines() if line.endswith("skipped") and "README commands" in line][0]
    assert " 0 failed" in summary and int(summary.split(": ")[1].split(" ok")[0]) >= 6, summary
