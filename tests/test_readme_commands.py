"""The commands of README.md and docs/**/*.md that do not train, and the documented error transcripts, run
verbatim on a fresh clone (scripts/readme_commands.py --quick); the full run, trainings shortened, is
`make readme-commands` and the slow test below."""

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


def test_transcripts_pair_a_failing_command_with_its_error_line_and_skip_marked_blocks(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```text\n$ rlx train algorithm=grpoo\nerror: unknown algorithm 'grpoo' (did you mean ...\n"
                    "$ rlx train fine=1\nno error shown\n```\n"
                    "```bash\n$ rlx train in_bash=1\nerror: x\n```\n"
                    "<!-- docs-check: skip (needs an edit) -->\n```text\n$ rlx train skipped=1\nerror: y\n```\n"
                    "<!-- docs-check: skip (needs an edit) -->\n```bash\nrlx train skipped=2\n```\n"
                    "```bash\nrlx train kept=3\n```\n")
    assert readme_commands.transcripts(page) == [("rlx train algorithm=grpoo",
                                                  "error: unknown algorithm 'grpoo' (did you mean ...")]
    assert readme_commands.readme_commands(page) == ["$ rlx train in_bash=1", "error: x", "rlx train kept=3"]


def test_error_lines_match_with_ellipsis_as_any_text():
    expected = "error: unknown algorithm 'grpoo' (did you mean 'grpo'?); valid choices: agent_grpo, ..."
    printed = ("warning: something\nerror: unknown algorithm 'grpoo' (did you mean 'grpo'?); valid choices: "
               "agent_grpo, cdpo\n")
    assert readme_commands.error_matches(expected, printed)
    assert not readme_commands.error_matches(expected, printed.replace("'grpo'?", "'gspo'?"))
    assert not readme_commands.error_matches("error: a", "error: ab")  # the whole line, not a prefix


@pytest.mark.skipif(not (REPO / ".git").exists(), reason="needs a git checkout to clone")
def test_quick_readme_commands_pass_on_a_fresh_clone():
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "readme_commands.py"), "--quick"],
                            capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    summary = [line for line in result.stdout.splitlines() if line.endswith("skipped") and "docs commands" in line][0]
    assert " 0 failed" in summary and int(summary.split(": ")[1].split(" ok")[0]) >= 12, summary
    assert "ok" in result.stdout and "$ rlx train algorithm=grpoo" in result.stdout  # the transcripts ran


@pytest.mark.long  # every command of the README and the docs, trainings shortened (~8 min on 2 cores)
@pytest.mark.skipif(not (REPO / ".git").exists(), reason="needs a git checkout to clone")
def test_every_docs_command_runs_on_a_fresh_clone():
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "readme_commands.py")], capture_output=True,
                            text=True, timeout=3600)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
    summary = [line for line in result.stdout.splitlines() if line.endswith("skipped") and "docs commands" in line][0]
    assert " 0 failed" in summary and int(summary.split(": ")[1].split(" ok")[0]) >= 40, summary
