"""bench.learning: the task table, the protocol each run is given, the resumable runner on a
tiny run, the aggregation's arithmetic, the quick net's verdicts; the image family's
settings. The quick net itself (minutes of training) is slow-marked."""

from __future__ import annotations

import dataclasses
import json
import math
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from bench import learning as L
from bench.learning_table import mean_curve, quick_verdicts, t_interval, time_to, write_table
from bench.learning_tasks import QUICK, TASKS, Quick, Task, slug, task

ROOT = Path(__file__).resolve().parents[1]


def test_table_covers_the_declared_families_and_policy_types():
    assert len(TASKS) >= 24
    assert len({slug(t) for t in TASKS}) == len(TASKS)
    fams = {t.family for t in TASKS}
    assert {"classic", "box2d", "mujoco", "minatar", "atari", "memory", "small"} <= fams
    assert all(t.seeds >= 3 for t in TASKS)
    quick = {t.policy for t in QUICK}
    assert len(QUICK) >= 10
    for kind in ("MLP discrete", "MLP continuous", "small-image CNN", "Nature CNN", "LSTM",
                 "MLP MultiBinary"):
        assert any(p.startswith(kind) for p in quick), kind
    assert any(p.startswith("Dict") for p in quick)
    assert task("cartpole").env_id == "CartPole-v1"
    with pytest.raises(KeyError, match="unknown task"):
        task("no-such-task")


def test_every_task_id_is_known_where_its_extra_is_installed():
    from ppokit.envs import check_env_id

    for t in TASKS:
        if L.installed(t):
            check_env_id(t.env_id)


def test_a_run_is_given_the_protocol_and_nothing_else(tmp_path):
    t = task("pendulum")
    cmd = L.train_command(t, 3, tmp_path / "r", t.steps)
    sets = cmd[cmd.index("--set") + 1:]
    assert {s.split("=")[0] for s in sets} == {"eval_every", "eval_episodes",
                                               "checkpoint_every"}
    assert cmd[cmd.index("--total-steps") + 1] == str(t.steps)
    assert cmd[cmd.index("--seed") + 1] == "3"
    mc = L.train_command(task("minatar-breakout"), 0, tmp_path / "m", 10**6)
    assert "eval_deterministic=false" in mc
    # 20 evaluations over the budget: Pendulum's preset is 4 envs x 1024 steps
    assert f"eval_every={max(1, 100_000 // 4096 // 20)}" in sets


def test_t_interval_is_students():
    m, lo, hi = t_interval([1.0, 2.0, 3.0])
    assert m == 2.0 and math.isclose(hi - m, 4.303 / math.sqrt(3), rel_tol=1e-6)
    assert math.isclose(m - lo, hi - m)
    assert t_interval([5.0]) == (5.0, 5.0, 5.0)
    m, lo, hi = t_interval([1.0] * 40 + [3.0] * 40)
    assert 1.96 * 1.0 / math.sqrt(80) < hi - m < 2.1 * 1.01 / math.sqrt(80)


def _rec(seed, curve, final, wall=10.0, steps=1000):
    return {"task": "x", "seed": seed, "curve": curve, "final": {"mean": final},
            "wall_s": wall, "steps": steps, "budget": steps}


def test_curves_and_time_to_threshold():
    a = _rec(0, [[100, 0.0, 1.0], [200, 5.0, 2.0], [300, 9.0, 3.0]], 9.0)
    b = _rec(1, [[100, 2.0, 1.5], [250, 8.0, 2.5], [300, 10.0, 4.0]], 10.0)
    grid, m, lo, hi = mean_curve([a, b])
    assert grid == [100, 200, 250, 300]
    assert m == [1.0, 3.5, 6.5, 9.5]  # each seed held constant between its points
    assert all(x <= y <= z for x, y, z in zip(lo, m, hi))
    assert time_to([a, b], 8.0) == (275.0, 2.75)
    assert time_to([a, b], 9.5) == (None, None)  # seed 0 never reaches it


def _write_result(results: Path, t: Task, seed: int, final: float) -> None:
    p = results / slug(t) / f"seed{seed}.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps({**_rec(seed, [[10, final, 1.0]], final), "task": t.name}))


def test_quick_verdicts_fail_on_a_fall(tmp_path):
    t = Task("T", "CartPole-v1", "classic", 10, "MLP discrete",
             quick=Quick(10, 0.95, "test"))
    _write_result(tmp_path, t, 0, 1.0)
    _write_result(tmp_path, t, 1, 0.96)
    lines: list[str] = []
    assert quick_verdicts([t], [0, 1], tmp_path, lines.append)
    assert "pass" in lines[-1] and "+0.01" in lines[-1]
    _write_result(tmp_path, t, 1, 0.745)
    assert not quick_verdicts([t], [0, 1], tmp_path, lines.append)
    assert "FAIL" in lines[-1]
    assert not quick_verdicts([t], [0, 1, 2], tmp_path, lines.append)  # a missing seed fails
    assert "missing" in lines[-1]


def test_table_marks_a_task_below_its_reference(tmp_path, monkeypatch):
    t = task("cartpole")
    for s, v in enumerate((500.0, 490.0, 480.0)):
        _write_result(tmp_path, t, s, v)
    refs = tmp_path / "refs.json"
    refs.write_text(json.dumps({
        "sources": {"a": {"project": "A"}, "b": {"project": "B"}},
        "rows": [{"task": t.env_id, "source": "a", "mean": 500.0, "std": 0.0, "n_seeds": 3,
                  "budget_steps": 100000},
                 {"task": t.env_id, "source": "b", "mean": 450.0, "std": 10.0, "n_seeds": 1,
                  "budget_steps": 100000}]}))
    doc = tmp_path / "doc.md"
    doc.write_text("head\n<!-- table:begin -->\nold\n<!-- table:end -->\ntail\n")
    monkeypatch.setattr("bench.learning_table.figure", lambda *a: None)
    write_table(tmp_path, refs, doc, tmp_path / "f.png")
    text = doc.read_text()
    assert text.startswith("head\n") and text.endswith("tail\n") and "old" not in text
    # mean 490, t-interval upper end 490 + 4.303*10/sqrt(3) = 514.8 >= 500: within A;
    # and above B
    assert "| A: 500.0 ± 0 (3), 100,000 | 0.98 | yes |" in text
    assert "| B: 450.0 ± 10.0 (1), 100,000 | 1.09 | yes |" in text
    for s, v in enumerate((300.0, 301.0, 302.0)):  # upper end 304.5 < 500 - 0
        _write_result(tmp_path, t, s, v)
    write_table(tmp_path, refs, doc, tmp_path / "f.png")
    assert "**no**" in doc.read_text()


def test_runner_trains_evaluates_writes_and_then_skips(tmp_path):
    t = Task("Tiny CartPole", "CartPole-v1", "classic", 2048, "MLP discrete",
             curve_points=2, curve_episodes=2, final_episodes=3)
    out, results = tmp_path / "runs", tmp_path / "results"
    log: list[str] = []
    done = L.Runner(out, results, jobs=1, log=log.append).run([(t, 0)])
    assert done == [results / "tiny-cartpole" / "seed0.json"]
    rec = json.loads(done[0].read_text())
    assert rec["steps"] >= 2048 and rec["budget"] == 2048
    assert rec["final"]["episodes"] == 3 and rec["final"]["deterministic"] is True
    assert rec["curve"] and all(len(p) == 3 for p in rec["curve"])
    assert rec["versions"]["torch"] and rec["commit"]
    assert L.Runner(out, results, jobs=1, log=log.append).run([(t, 0)]) == []
    assert "already have a result file" in log[-1]
    longer = dataclasses.replace(t, steps=4096)  # another budget: trained again
    assert L.Runner(out, results, jobs=1, log=log.append).run([(longer, 0)]) == done
    assert json.loads(done[0].read_text())["budget"] == 4096
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handlers restored


def test_a_run_with_a_checkpoint_resumes(tmp_path):
    t = task("cartpole")
    run_dir = tmp_path / "r"
    (run_dir / "checkpoints" / "iter_000000004").mkdir(parents=True)
    cmd, what = L.command_for(t, 0, run_dir, t.steps)
    assert cmd[-5:] == ["--resume", str(run_dir), "--no-progress", "--eval-episodes", "0"]
    assert what.startswith("resuming")
    (run_dir / "bench-trained").touch()
    assert L.command_for(t, 0, run_dir, t.steps)[1] == ""  # evaluation only
    half = tmp_path / "h"
    half.mkdir()
    (half / "metrics.jsonl").write_text("")
    cmd, what = L.command_for(t, 0, half, t.steps)  # stopped before its first checkpoint
    assert not half.exists() and "--resume" not in cmd


def test_seed_lists():
    assert L.parse_seeds("0-4") == [0, 1, 2, 3, 4]
    assert L.parse_seeds("0,2, 5") == [0, 2, 5]


@pytest.mark.slow  # about 5 minutes on two cores
def test_quick_net_image_tasks_learn(tmp_path):
    """The small-image, Dict and Nature-CNN rows of the quick net: every seed >= 0.95."""
    names = [slug(t) for t in QUICK if t.family == "small"]
    r = subprocess.run([sys.executable, "-m", "bench.learning", "quick", "--jobs", "2",
                        "--tasks", ",".join(names), "--out", str(tmp_path / "q")],
                       cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "quick net: pass" in r.stdout


def test_the_summary_counts_references_at_the_rows_budget_apart(tmp_path, monkeypatch):
    """A reference trained ten times longer is shown and counted in the strict figure, and
    left out of the second, same-budget count."""
    t = task("cartpole")  # (the result files say a budget of 1,000 steps)
    for s, v in enumerate((300.0, 301.0, 302.0)):
        _write_result(tmp_path, t, s, v)
    refs = tmp_path / "refs.json"
    refs.write_text(json.dumps({
        "sources": {"a": {"project": "A"}, "b": {"project": "B"}},
        "rows": [{"task": t.env_id, "source": "a", "mean": 290.0, "std": 5.0, "n_seeds": 3,
                  "budget_steps": 1_500},
                 {"task": t.env_id, "source": "b", "mean": 500.0, "std": 0.0, "n_seeds": 1,
                  "budget_steps": 10_000}]}))
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- table:begin -->\n<!-- table:end -->\n")
    monkeypatch.setattr("bench.learning_table.figure", lambda *a: None)
    write_table(tmp_path, refs, doc, tmp_path / "f.png")
    text = " ".join(doc.read_text().split())
    assert "with a reference: 1, of which within or above every reference: 0." in text
    assert ("Counting only references at the row's budget (within a factor of 2): 1 tasks "
            "with one, 1 within or above every such reference.") in text


def test_ant_is_trained_on_the_task_its_references_measured():
    """The published Ant numbers were measured where contact forces were zero (Ant-v3 under
    MuJoCo 2+) or left out (Ant-v4): the row's settings give Ant-v5 that task, and so the
    table shows those references for it; a task whose settings are not the published one
    (the 64×64 image) is shown with none."""
    ant = task("ant")
    kwargs = json.loads(ant.sets["env_kwargs"])
    assert ant.published and kwargs == {"include_cfrc_ext_in_observation": False,
                                        "contact_cost_weight": 0.0}
    assert not task("image-side-nature-cnn-64-64-3").published
    from bench.learning_tasks import random_key

    assert random_key(task("hopper")) == "Hopper-v5"
    assert random_key(ant) == ("Ant-v5 {\"contact_cost_weight\": 0.0, "
                               "\"include_cfrc_ext_in_observation\": false}")
    cmd = L.train_command(ant, 0, Path("/tmp/unused"), ant.steps)
    assert f"env_kwargs={ant.sets['env_kwargs']}" in cmd
    if L.installed(ant):
        import gymnasium as gym

        env = gym.make(ant.env_id, **kwargs)
        assert env.observation_space.shape == (27,)
        env.reset(seed=0)
        _, _, _, _, info = env.step(env.action_space.sample())
        assert info["reward_ctrl"] != 0.0 and info["reward_contact"] == 0.0
        env.close()


def test_minatar_breakout_is_trained_on_gymnaxs_task():
    """gymnax's Breakout-MinAtar (the row's one reference) has no sticky actions and ends
    episodes at 1,000 steps: the row's settings give MinAtar's Breakout-v1 both, in the
    environments ppokit trains and evaluates on."""
    br = task("minatar-breakout")
    assert br.published and br.steps == 10_000_000
    assert json.loads(br.sets["env_kwargs"]) == {"sticky_action_prob": 0.0,
                                                 "max_episode_steps": 1000}
    cmd = L.train_command(br, 0, Path("/tmp/unused"), br.steps)
    assert f"env_kwargs={br.sets['env_kwargs']}" in cmd
    if L.installed(br):
        from ppokit.envs.vec import make_vec

        env = make_vec(br.env_id, 2, env_kwargs=json.loads(br.sets["env_kwargs"]))
        inner = env.envs[0]
        assert inner.spec.max_episode_steps == 1000
        assert inner.unwrapped.game.sticky_action_prob == 0.0
        env.close()


def test_wall_time_per_million_steps_is_the_median_seed():
    """One seed paused for hours (its wall time counts the pause) does not move the
    column: 1,000 / 1,100 / 9,000 s for 1M steps gives 1,100."""
    from bench.learning_table import task_row

    recs = [{**_rec(s, [[10, 1.0, 1.0]], 1.0), "wall_s": w, "steps": 1_000_000}
            for s, w in enumerate((1000.0, 9000.0, 1100.0))]
    assert task_row(task("cartpole"), recs, [], None)["wall_per_m"] == 1100.0


def test_a_result_records_the_commit_of_the_checkout_that_trained_it(tmp_path):
    """With ``--src`` (the quick net on another checkout) the result names that checkout's
    commit, not this one's; a checkout with changed tracked files says so."""
    import subprocess

    def git(*args):
        return subprocess.run(["git", "-C", str(tmp_path), *args], check=True,
                              capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "x.py").write_text("a = 1\n")
    git("add", "src/x.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    rev = git("rev-parse", "--short", "HEAD")
    assert L._commit(tmp_path / "src") == rev
    assert L._commit(tmp_path / "src") != L._commit()  # this checkout's commit differs
    (tmp_path / "src" / "x.py").write_text("a = 2\n")
    assert L._commit(tmp_path / "src") == rev + "+changes"
