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


def test_the_time_limit_bounds_the_time_remaining(monkeypatch):
    """A run of 400 iterations under a 100-second limit (the default run has one) says how
    long until the limit, not how long 400 iterations would take."""
    from ppokit.llm.training import progress

    now = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    out = io.StringIO()
    with Progress(400, 0, tty=False, every=0.0, stream=out, time_limit=100.0) as bar:
        now[0] = 90.0
        bar.advance(dict(REC, wall_time=90.0))
        now[0] = 180.0
        bar.advance(dict(REC, wall_time=180.0))
    first, second = out.getvalue().splitlines()
    assert first.endswith("elapsed 0:01:30  remaining 0:00:10 (time limit)")
    assert second.endswith("remaining 0:00:00 (time limit)")
    out = io.StringIO()  # no limit: the iterations left at the rate so far
    now[0] = 0.0
    with Progress(4, 0, tty=False, every=0.0, stream=out) as bar:
        now[0] = 90.0
        bar.advance(dict(REC, wall_time=90.0))
    assert out.getvalue().rstrip().endswith("elapsed 0:01:30  remaining 0:04:30")


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


TIMED = {**REC, "response_tokens": 600.0, "time_generation": 0.5, "time_scoring": 0.1,
         "time_training": 0.4}


def test_the_speed_of_each_phase_in_the_line():
    out = io.StringIO()
    with Progress(2, 0, tty=False, every=0.0, stream=out) as bar:
        bar.advance(TIMED)
        bar.advance({**TIMED, "response_tokens": 1400.0, "time_training": 1.4})
    first, last = out.getvalue().splitlines()
    assert "clip -  gen 1.2k tok/s  train 1.5k tok/s (gen 50% score 10% train 40%)  " \
        "elapsed" in first, first
    # over the iterations so far: 2000 tokens in 1 s of generation, 1.8 s of training
    assert "gen 2.0k tok/s  train 1.1k tok/s (gen 33% score 7% train 60%)" in last, last
    assert bar.speed.summary() == ("2,000 completion tokens: generation 2,000 tokens/s, "
                                   "training 1,111 tokens/s; time in generation 33%, "
                                   "scoring 7%, training 60%")


def test_llm_train_prints_the_speed_in_its_summary(tmp_path, capsys, monkeypatch):
    from ppokit.cli import main

    monkeypatch.setenv("PPOKIT_LOG_EVERY", "0.000001")
    assert main(["llm", "train", "--no-eval", "--iterations", "2", "--run-dir",
                 str(tmp_path / "run"), "--set", "prompts_per_iter=2", "--set",
                 "samples_per_prompt=2"]) == 0
    out, err = capsys.readouterr()
    lines = [x for x in err.splitlines() if x.startswith("llm train: iteration")]
    assert len(lines) == 2 and all(" tok/s (gen " in x for x in lines), err
    (summary,) = [x for x in out.splitlines() if "completion tokens: generation" in x]
    assert "tokens/s, training " in summary and "time in generation " in summary
