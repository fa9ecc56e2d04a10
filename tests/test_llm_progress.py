"""The token trainer's progress off a terminal: plain lines at an interval and after the last
iteration, never a bar's frame."""

import io

from ppokit.llm.training.progress import Progress

REC = {"score_mean": 0.5, "kl_ref": 0.01, "response_length_mean": 7.0, "clipfrac": None}


def test_plain_lines_off_a_terminal():
    out = io.StringIO()
    with Progress(5, 0, tty=False, every=0.0, stream=out) as bar:
        for _ in range(5):
            bar.advance(REC)
    lines = out.getvalue().splitlines()
    assert len(lines) == 5
    assert lines[0].startswith("llm train: iteration 1/5  score 0.500  kl_ref 0.010  len 7.0  "
                               "clip -  elapsed 0:00:00  remaining ")
    assert lines[-1].startswith("llm train: iteration 5/5")
    assert "\r" not in out.getvalue() and "…" not in out.getvalue()


def test_interval_and_the_last_iteration():
    out = io.StringIO()
    with Progress(4, 1, tty=False, every=3600.0, stream=out) as bar:
        for _ in range(3):
            bar.advance(REC)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llm train: iteration 4/4")


def test_disabled_prints_nothing():
    out = io.StringIO()
    with Progress(3, 0, enabled=False, tty=False, every=0.0, stream=out) as bar:
        bar.advance(REC)
    assert out.getvalue() == ""
