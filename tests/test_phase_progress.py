"""Long phases outside the training steps show a rich bar on a terminal (issue 18): reference log-probs."""

import io

import torch
from rich.console import Console

from rlx.loops.preference import reference_logps
from rlx.models.loading import load_causal_lm
from rlx.runtime.rundir import PhaseProgress


class Counter:
    def __init__(self):
        self.done = 0

    def advance(self, amount=1):
        self.done += amount


def _pairs(n):
    return [{"prompt_tokens": [5, 6, 7][: 1 + i % 3], "chosen_tokens": [8, 9], "rejected_tokens": [10 + i % 4]}
            for i in range(n)]


def test_reference_pass_reports_every_pair_once():
    model = load_causal_lm("builtin:tiny", "float32")
    pairs = _pairs(7)
    counter = Counter()
    with torch.no_grad():
        out = reference_logps(model, pairs, 3, 0, counter)
    assert out.shape == (7, 2) and counter.done == 7


def test_phase_bar_draws_on_request_and_stays_silent_off_a_terminal():
    stream = io.StringIO()
    bar = PhaseProgress("reference log-probs", 4, progress=True, console=Console(file=stream, force_terminal=True,
                                                                                 width=100))
    with bar:
        for _ in range(4):
            bar.advance()
    assert "reference log-probs" in stream.getvalue() and "4/4" in stream.getvalue()
    quiet = PhaseProgress("reference log-probs", 4, progress="auto")  # pytest's stderr is not a terminal
    assert quiet._bar is None
    with quiet:
        quiet.advance()


def test_a_log_line_during_a_bar_prints_above_it_and_the_handler_gets_its_stream_back():
    import logging
    import sys

    stream = io.StringIO()
    handler = logging.StreamHandler(sys.stdout)  # as Hydra's job logging makes it, before any bar starts
    logger = logging.getLogger("rlx.test_bar")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        with PhaseProgress("data building", 2, progress=True,
                           console=Console(file=stream, force_terminal=True, width=100)):
            logger.warning("checkpoint written")
            logger.warning("a long path /" + "x" * 150)
            assert handler.stream is not sys.stdout
        # rich rendered the lines through its console (above the bar), not into the bar's line, and left
        # the long one unwrapped (100 columns here)
        assert "checkpoint written\n" in stream.getvalue() and "/" + "x" * 150 + "\n" in stream.getvalue()
        assert handler.stream is sys.stdout
    finally:
        logger.removeHandler(handler)
