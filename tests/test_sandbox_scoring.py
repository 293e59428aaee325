"""Honest sandbox scores: a problem passes only when the harness reaches its end and prints the run's fresh
token (never on exit status alone); cheats that exit early or fake equality fail (issue 17)."""

import pytest

from rlx.sandbox import check_program

TEST = "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(3) == 6\n"

CHEATS = {
    "sys_exit_at_import": "import sys\nsys.exit(0)\ndef f(x):\n    return 0\n",
    "sys_exit_in_call": "def f(x):\n    import sys\n    sys.exit(0)\n",
    "os_exit": "import os\nos._exit(0)\n",
    "os_exit_in_call": "def f(x):\n    import os\n    os._exit(0)\n",
    "atexit": "import atexit, os\natexit.register(lambda: os._exit(0))\ndef f(x):\n    return 0\n",
    "excepthook": "import sys\nsys.excepthook = lambda *a: None\ndef f(x):\n    return 0\n",
    "always_equal": "class Any:\n    def __eq__(self, other):\n        return True\ndef f(x):\n    return Any()\n",
    "int_subclass": "class I(int):\n    def __eq__(self, other):\n        return True\ndef f(x):\n    return I(0)\n",
    "fake_pass_line": "print('rlx-harness-passed:' + '0' * 32)\nimport os\nos._exit(0)\n",
}


@pytest.mark.parametrize("name", sorted(CHEATS))
def test_cheats_fail(name):
    result = check_program(CHEATS[name], TEST, "f")
    assert not result.passed and result.status == "failed", (name, result)


def test_an_honest_solution_passes_and_a_wrong_one_fails():
    assert check_program("def f(x):\n    return 2 * x\n", TEST, "f").passed
    assert check_program("def f(x):\n    return [x][0] * 2\n", TEST, "f").passed
    assert not check_program("def f(x):\n    return 3 * x\n", TEST, "f").passed


def test_stdin_is_a_pipe_the_sample_cannot_reread():
    code = ("import os, sys\n"
            "def f(x):\n"
            "    assert not os.path.isfile(os.path.realpath('/proc/self/fd/0')), 'stdin is a host file'\n"
            "    assert sys.stdin.read() == ''  # the token was consumed by the harness\n"
            "    return 2 * x\n")
    assert check_program(code, TEST, "f").passed
