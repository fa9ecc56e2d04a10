"""The run lifecycle both trainers inherit (ppokit/io/lifecycle.py), on a toy trainer whose
iterations only count: checkpoints once per iteration and on schedule, the time limit,
early stops, signals and failures."""

from pathlib import Path

import pytest

from ppokit.errors import UsageError
from ppokit.io.lifecycle import Plan, RunLifecycle
from ppokit.io.rundir import RunDir
from ppokit.io.signals import Interrupted


class _Toy(RunLifecycle):
    def __init__(self, run_dir: Path, total=5, every=2, limit=None, stop_at=None, fail_at=None):
        self.run_dir, self.rundir = run_dir, RunDir(run_dir, new=True)
        self.run_plan = Plan(total, every, limit)
        self.iteration, self.elapsed, self.messages, self.written = 0, 0.0, [], []
        self.stop_at, self.fail_at, self.finished = stop_at, fail_at, False
        self.log = self.messages.append

    def plan(self):
        return self.run_plan

    def run_iteration(self):
        if self.iteration + 1 == self.fail_at:
            raise UsageError("reward: broke")
        self.iteration += 1
        self.elapsed += 10.0
        return {"iteration": self.iteration}

    def write_checkpoint(self):
        self.written.append(self.iteration)
        path = self.checkpoint_path(self.iteration)
        path.mkdir(parents=True)
        return path

    def resume_command(self):
        return f"resume {self.run_dir}"

    def stop_requested(self, rec):
        return "asked" if rec["iteration"] == self.stop_at else None

    def finish(self):
        self.finished = True


def test_checkpoints_on_schedule_and_once_at_the_end(tmp_path):
    t = _Toy(tmp_path / "r")
    t.run_to_end()
    assert t.written == [2, 4, 5] and t.finished and not t.stopped_early
    assert t.checkpoint() == t.checkpoint_path(5) and t.written == [2, 4, 5]  # once


def test_time_limit_and_early_stop_end_with_a_checkpoint(tmp_path):
    t = _Toy(tmp_path / "a", total=10, every=100, limit=25.0)
    t.run_to_end()
    assert t.iteration == 3 and t.written == [3] and t.finished
    assert t.stop_reason.startswith("time limit of 25 s") and "at iteration 3" in t.messages[0]
    s = _Toy(tmp_path / "b", total=10, every=100, stop_at=4)
    s.run_to_end()
    assert s.written == [4] and s.stopped_early and s.stop_reason == "asked" and s.finished


def test_a_signal_stops_at_the_boundary_with_a_checkpoint(tmp_path):
    class Stop:
        requested, signum = True, 15

    t = _Toy(tmp_path / "r", every=100)
    with pytest.raises(Interrupted) as exc:
        t.run_to_end(Stop())
    assert exc.value.iteration == 1 and exc.value.checkpoint == t.checkpoint_path(1)
    assert exc.value.exit_code == 143 and not t.finished


def test_a_failure_before_any_checkpoint_removes_the_run_after_it_names_the_resume(tmp_path):
    first = _Toy(tmp_path / "new", fail_at=1)
    with pytest.raises(UsageError, match="no checkpoint had been written"):
        first.run_to_end()
    assert not (tmp_path / "new").exists()
    later = _Toy(tmp_path / "kept", fail_at=3)
    with pytest.raises(UsageError, match=r"iter_000000002 .* `resume .*kept`"):
        later.run_to_end()
    assert (tmp_path / "kept" / "checkpoints" / "iter_000000002").is_dir()
