"""ppokit report reads every signal a run has: held-out evaluations before a "nothing
was learned" verdict, a task solved early (the return at its best, the entropy low by
design), and advice that belongs to the run's kind. Small synthetic run directories
(metrics.jsonl, eval.json) written by each test."""

from __future__ import annotations

import json

import numpy as np

from ppokit.diagnose import report
from ppokit.diagnose.metrics import read_metrics_table

NOT_LEARNED = ("nothing was learned", "never moves")


def write_run(path, records, eval_json=None, best=False):
    path.mkdir()
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if eval_json is not None:
        (path / "eval.json").write_text(json.dumps(eval_json))
    if best:
        (path / "best").mkdir()
    return path


def grpo_flat_score(n=12, seed=0):
    """A 12-iteration GRPO run on a yes/no task: the training score (4 samples of few
    prompts) wanders around 0.45 with the same median in the first and last thirds."""
    rng = np.random.default_rng(seed)
    base = [0.4531, 0.5, 0.4062, 0.4531, 0.5156, 0.375, 0.4531, 0.4844, 0.4531, 0.4219,
            0.5, 0.4531][:n]
    return [{"iteration": i + 1, "score_mean": s, "score_std": 0.5,
             "kl_ref": float(0.001 * i + abs(rng.normal(0, 1e-4))),
             "response_length_mean": float(3 + rng.normal(0, 0.1)),
             "truncated_frac": 0.0, "approx_kl": float(abs(rng.normal(0.002, 5e-4))),
             "clipfrac": float(abs(rng.normal(0.05, 0.01))), "entropy": 0.6,
             "zero_spread_frac": 0.25} for i, s in enumerate(base)]


def texts(findings):
    return " ".join(f.message.lower() for f in findings)


def test_reward_flat_weighs_eval_json(tmp_path):
    """Held-out greedy 0.30 → 0.70 and sampled 0.60 → 0.70: no reward-flat, and no
    finding says the run learned nothing."""
    ev = {"score_mean": 0.7, "reference_score_mean": 0.6, "greedy_score_mean": 0.7,
          "reference_greedy_score_mean": 0.3}
    run = write_run(tmp_path / "smol", grpo_flat_score(), ev)
    found = report(run)
    assert "reward-flat" not in [f.code for f in found]
    assert not any(t in texts(found) for t in NOT_LEARNED), texts(found)
    from ppokit.diagnose.context import held_out

    h = held_out(read_metrics_table(run))
    assert h.improved is True and "greedy_score_mean 0.3 → 0.7" in h.text
    # the same metrics with no held-out evaluation: 12 of the default 400 iterations are
    # too few for a verdict (info, not a warning)
    bare = write_run(tmp_path / "bare", grpo_flat_score())
    flat = [f for f in report(bare) if f.code == "reward-flat"]
    assert [f.severity for f in flat] == ["info"] and "too early" in flat[0].message
    assert not any(t in flat[0].message.lower() for t in NOT_LEARNED)
    # over a full budget with no held-out evaluation, the flat score is a warning
    long = grpo_flat_score() * 40
    for i, r in enumerate(long):
        long[i] = {**r, "iteration": i + 1}
    flat = [f for f in report(write_run(tmp_path / "long", long)) if f.code == "reward-flat"]
    assert [f.severity for f in flat] == ["warning"]
    assert "no held-out evaluation" in flat[0].message
    # ... and with a held-out score that stayed where the reference was, it says so
    same = write_run(tmp_path / "same", long,
                     {**ev, "greedy_score_mean": 0.3, "score_mean": 0.6})
    flat = [f for f in report(same) if f.code == "reward-flat"]
    assert len(flat) == 1 and "did not rise either" in flat[0].message


def test_reward_flat_weighs_eval_rows(tmp_path):
    recs = grpo_flat_score()
    for r, v in zip(recs[::3], (0.3, 0.45, 0.6, 0.7)):
        r["eval/score_mean"] = v
    found = report(write_run(tmp_path / "rows", recs))
    assert "reward-flat" not in [f.code for f in found]


def collapse_curve(n=60):
    """Rises to a plateau by a third of the run, then falls for good."""
    return [4.0 + 16.0 * min(1.0, i / (n / 4)) if i < n * 0.6 else 6.0 for i in range(n)]


def test_return_collapse_advice_follows_the_run_kind(tmp_path):
    n = 60
    env = [{"iteration": i + 1, "episode_return_mean": v, "approx_kl": 0.005,
            "clipfrac": 0.1} for i, v in enumerate(collapse_curve(n))]
    lm = [{"iteration": i + 1, "score_mean": v / 20, "kl_ref": 0.01,
           "response_length_mean": 5.0, "approx_kl": 0.005, "clipfrac": 0.1}
          for i, v in enumerate(collapse_curve(n))]
    agent = [{**r, "episode/truncated_frac": 0.1, "tool/calls_per_episode": 1.0,
              "tool/failed_per_episode": 0.0} for r in lm]
    got = {}
    for name, recs in (("env", env), ("lm", lm), ("agent", agent)):
        run = write_run(tmp_path / name, recs)
        msgs = [f.message for f in report(run) if f.code == "return-collapse"]
        assert len(msgs) == 1, name
        got[name] = msgs[0]
    assert "ppokit eval --best" in got["env"] and "best/" in got["env"]
    for kind in ("lm", "agent"):
        assert "best/" not in got[kind] and "stop_at_return" not in got[kind]
        assert "--eval-every" in got[kind]
    assert "eval/episode/solved_frac" in got["agent"]


def solved_early(n=50, seed=0):
    """A user's environment solved at 20/20 by iteration 8: the return sits at 20, the
    policy becomes deterministic once it is solved, updates stop moving it."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        ret = 20.0 if i >= 8 else 4.0 + 2.0 * i
        ent = 0.69 if i < 8 else 0.69 * np.exp(-(i - 8) / 3) + 1e-3
        out.append({"iteration": i + 1, "episode_return_mean": ret,
                    "entropy": float(ent), "approx_kl": float(abs(rng.normal(1e-4, 5e-5))),
                    "clipfrac": 0.0 if i > 12 else 0.05,
                    "explained_variance": 0.5, "value_loss": 0.1})
    return out


def test_task_solved_early_is_not_a_collapse(tmp_path):
    found = report(write_run(tmp_path / "solved", solved_early()))
    assert [f.code for f in found if f.severity != "info"] == [], \
        [(f.code, f.message[:80]) for f in found]
    # the same entropy fall while the return is still climbing is a collapse
    recs = solved_early()
    for i, r in enumerate(recs):
        r["episode_return_mean"] = 4.0 + 16.0 * i / (len(recs) - 1)
        r["entropy"] = float(0.69 * np.exp(-i / 2) + 1e-3)
    codes = [f.code for f in report(write_run(tmp_path / "early", recs))]
    assert "entropy-collapse" in codes


def test_agent_run_plot_has_no_empty_panel(tmp_path, monkeypatch):
    """An agent run logs episode/truncated_frac, not truncated_frac: its truncated-share
    panel draws that; a panel no run has data for is not drawn."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    from ppokit.llm.evaluation.plots import plot_llm_runs

    recs = [{"iteration": i + 1, "score_mean": 0.1 * i, "kl_ref": 0.01 * i,
             "episode/return_mean": 0.1 * i, "episode/tokens_mean": 30.0,
             "episode/truncated_frac": 0.5 - 0.05 * i, "tool/calls_per_episode": 1.0,
             "tool/failed_per_episode": 0.0} for i in range(8)]
    run = write_run(tmp_path / "agent", recs)
    (run / "reference").mkdir()
    seen = []
    save = Figure.savefig

    def spy(fig, *a, **k):
        seen.append([(ax.get_title(), sum(len(ln.get_xdata()) for ln in ax.get_lines()))
                     for ax in fig.axes])
        return save(fig, *a, **k)

    monkeypatch.setattr(Figure, "savefig", spy)
    plot_llm_runs([run], tmp_path / "agent.png")
    panels = seen[0]
    assert all(points > 0 for _, points in panels), panels
    assert any(title.startswith("truncated share") for title, _ in panels), panels


def test_value_loss_divergence(tmp_path):
    """Rewards of 10⁵ per step, unnormalised: the value loss sits at 10¹¹, explained
    variance at 0, and the policy never moves (its gradient is clipped away with the
    critic's)."""
    recs = [{"iteration": i + 1, "global_step": 512 * (i + 1),
             "episode_return_mean": 1e6 + 5e4 * np.sin(i), "value_loss": 2.2e11 + 1e9 * i,
             "explained_variance": 0.0, "approx_kl": 0.0, "clipfrac": 0.0,
             "entropy": 0.6931} for i in range(40)]
    found = report(write_run(tmp_path / "huge", recs))
    assert "value-loss-divergence" in [f.code for f in found]
    # a healthy critic's loss that rises with the returns, explained variance high: none
    ok = [{**r, "value_loss": 10.0 * (i + 1), "explained_variance": 0.8}
          for i, r in enumerate(recs)]
    assert "value-loss-divergence" not in [f.code for f in report(write_run(tmp_path / "ok",
                                                                            ok))]


def test_default_budget_is_llm_trains():
    from ppokit.diagnose.context import LM_DEFAULT_ITERATIONS
    from ppokit.llm.training.config import LLMConfig

    assert LM_DEFAULT_ITERATIONS == LLMConfig().iterations


def test_held_out_reads_an_agent_runs_eval_json(tmp_path):
    """ppokit llm eval of an agent run writes the return and solved rate against the
    reference (greedy and sampled): a rise in any of them is held-out evidence, a fall
    in all is not; the prompt-run keys are not looked for."""
    from ppokit.diagnose.context import held_out

    recs = [{"iteration": i + 1, "score_mean": 0.2, "kl_ref": 0.01, "episode/return_mean": 0.2,
             "episode/solved_frac": 0.3, "tool/calls_per_episode": 0.0} for i in range(6)]
    up = {"return_mean": 0.3, "reference_return_mean": 0.29, "greedy_return_mean": 0.6,
          "reference_greedy_return_mean": 0.2, "solved_frac": 0.5,
          "reference_solved_frac": 0.5, "greedy_solved_frac": 0.7,
          "reference_greedy_solved_frac": 0.4}
    h = held_out(read_metrics_table(write_run(tmp_path / "up", recs, up)))
    assert h.improved is True and "greedy_return_mean 0.2 → 0.6" in h.text
    assert "solved_frac 0.5 → 0.5" in h.text
    down = {k: (0.1 if k.startswith("reference_") else 0.0) for k in up}
    h = held_out(read_metrics_table(write_run(tmp_path / "down", recs, down)))
    assert h.improved is False and "eval.json: greedy_return_mean 0.1 → 0" in h.text
    # a prompt run's keys in an agent run's eval.json are not what it is judged by
    lm_keys = {"score_mean": 0.9, "reference_score_mean": 0.1}
    assert held_out(read_metrics_table(write_run(tmp_path / "lm", recs, lm_keys))).improved \
        is None
