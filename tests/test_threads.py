"""ppokit.threads: the thread count on a shared machine (the cores no other process keeps
busy), and the language-model CLI's use of it for a user model."""

import pytest
import torch

import ppokit.threads as th


def test_busy_cores_reads_the_kernel_counters(monkeypatch):
    ticks = iter([(100, 1000), (100 + 150, 1000 + 200)])  # 150 of 200 jiffies busy
    monkeypatch.setattr(th, "_cpu_times", lambda: next(ticks))
    monkeypatch.setattr(th.os, "cpu_count", lambda: 2)
    assert th.busy_cores(window=0) == pytest.approx(1.5)
    monkeypatch.setattr(th, "_cpu_times", lambda: None)  # not Linux: nothing known
    assert th.busy_cores(window=0) == 0.0


def test_the_real_counters_give_a_plausible_figure():
    busy = th.busy_cores(window=0.05)
    assert 0.0 <= busy <= (th.os.cpu_count() or 1) + 1e-9


@pytest.mark.parametrize("busy, want, cores, expect", [
    (0.1, None, 2, 2),   # quiet: every core
    (0.4, 2, 2, 2),      # under half a core's worth: still free
    (1.0, 2, 2, 1),      # another process holds a core
    (1.9, 2, 2, 1),      # both busy: at least one
    (1.0, 8, 8, 7),
    (3.0, 4, 8, 4),      # 3 of 8 busy: 5 free, the 4 wanted
    (0.0, 1, 2, 1),      # one asked: one
])
def test_choose_threads_leaves_out_the_busy_cores(monkeypatch, busy, want, cores, expect):
    monkeypatch.setattr(th, "busy_cores", lambda window=0.25: busy)
    monkeypatch.setattr(th, "usable_cores", lambda: cores)
    monkeypatch.setattr(th.os, "cpu_count", lambda: 8 if cores > 2 else 2)
    n, why = th.choose_threads(want, window=0)
    assert n == expect
    assert ("busy" in why) == (n < (want or cores))


def test_the_cli_gives_a_user_model_the_free_cores(monkeypatch):
    from ppokit.llm import cli

    before = torch.get_num_threads()
    monkeypatch.delenv("PPOKIT_THREADS", raising=False)
    monkeypatch.setattr(th, "choose_threads",
                        lambda want=None, window=0.25: (1, "1 thread: other processes keep "
                                                        "1.0 of 2 cores busy"))
    try:
        torch.set_num_threads(2)
        cli.set_threads("some/model")
        assert torch.get_num_threads() == 1
        assert "other processes keep 1.0 of 2 cores busy" in cli.THREADS_NOTE[0]
        monkeypatch.setenv("PPOKIT_THREADS", "2")  # the user's number wins
        cli.set_threads("some/model")
        assert torch.get_num_threads() == 2
    finally:
        cli.THREADS_NOTE.clear()
        torch.set_num_threads(before)
