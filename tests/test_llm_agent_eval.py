"""``ppokit llm eval`` of an agent run (ppokit/llm/evaluation/agent_eval.py): the trained
policy and the reference on held-out seeds, sampled and greedy, with 95 % intervals and
the gain paired by seed; every figure recomputed here from the episodes eval.json keeps;
the environment and tools named again, never imported because the run names them."""

import json
import math
import statistics
import sys

import pytest

pytest.importorskip("transformers")

from ppokit.cli import main  # noqa: E402

GUESS = ["llm", "train", "--env", "ppokit/GuessNumber-v0", "--iterations", "2",
         "--set", "prompts_per_iter=2", "--set", "samples_per_prompt=2",
         "--set", "max_turns=4", "--set", "sft_steps=60", "--set", "time_limit=0",
         "--set", "n_eval_prompts=16", "--set", "eval_every=2", "--no-progress", "--no-eval"]
# the generator of the in-run held-out evaluation: the run's seed (0) + 7919
IN_RUN_SEED = "7919"
# a user's tool module that says when it is imported
TOOL_MODULE = '''
import os
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "imports.log"), "a") as fh:
    fh.write("imported\\n")
from ppokit.llm.agents.env import calc
'''


@pytest.fixture(scope="module")
def guess_run(tmp_path_factory):
    rd = tmp_path_factory.mktemp("agent_eval") / "guess"
    assert main([*GUESS, "--run-dir", str(rd)]) == 0
    return rd


@pytest.fixture(scope="module")
def evaluated(guess_run):
    """``ppokit llm eval`` of the run once per module (each test that reads eval.json
    asks for it, so none depends on another test having run first on its worker): the
    eval.json it wrote and its printed lines."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["llm", "eval", str(guess_run), "--seed", IN_RUN_SEED]) == 0
    return json.loads((guess_run / "eval.json").read_text()), out.getvalue()


def _wilson(k: int, n: int) -> tuple[float, float]:
    z = 1.96
    p = k / n
    c = (p + z * z / (2 * n)) / (1 + z * z / n)
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, c - h), min(1.0, c + h)


def _normal(xs: list[float]) -> tuple[float, float]:
    m = statistics.fmean(xs)
    h = 1.96 * statistics.stdev(xs) / math.sqrt(len(xs))
    return m - h, m + h


def _interval(xs: list[float], counts: bool = False) -> tuple[float, float]:
    if not counts and set(xs) <= {0.0, 1.0}:
        return _wilson(int(sum(xs)), len(xs))
    return _normal(xs)


def _close(a, b) -> bool:
    return all(math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12) for x, y in zip(a, b, strict=True))


def _check_against_episodes(ev: dict) -> None:
    """Every figure of eval.json against a plain recomputation from its episodes."""
    eps = ev["episodes"]
    n = ev["n_episodes"]
    for prefix in ("", "greedy_"):
        trained, ref = eps[prefix + "trained"], eps[prefix + "reference"]
        seeds = [r["seed"] for r in trained]
        assert seeds == [r["seed"] for r in ref] == [2**31 + k for k in range(n)]
        for who, recs in (("", trained), ("reference_", ref)):
            for r in recs:
                assert r["solved"] == (r["terminated"] and r["return"] > 0)
            solved = [float(r["solved"]) for r in recs]
            rets = [float(r["return"]) for r in recs]
            turns = [float(r["turns"]) for r in recs]
            k = who + prefix
            assert ev[k + "solved_frac"] == pytest.approx(sum(solved) / n)
            assert _close(ev[k + "solved_frac_ci95"], _wilson(int(sum(solved)), n))
            assert ev[k + "return_mean"] == pytest.approx(statistics.fmean(rets))
            assert _close(ev[k + "return_ci95"], _interval(rets))
            assert ev[k + "turns_mean"] == pytest.approx(statistics.fmean(turns))
            assert _close(ev[k + "turns_ci95"], _interval(turns, counts=True))
        for key, field in (("solved_frac", "solved"), ("return", "return"),
                           ("turns", "turns")):
            diffs = [float(a[field]) - float(b[field]) for a, b in zip(trained, ref)]
            assert ev[f"{prefix}{key}_gain"] == pytest.approx(statistics.fmean(diffs))
            assert _close(ev[f"{prefix}{key}_gain_ci95"], _normal(diffs))


def test_agent_eval_reports_before_and_after_from_its_episodes(guess_run, evaluated):
    from ppokit.diagnose.context import held_out
    from ppokit.diagnose.metrics import read_metrics_table
    from ppokit.io import read_metrics

    ev, out = evaluated
    assert ev["n_episodes"] == ev["n_prompts"] == 16 and ev["env"] == "ppokit/GuessNumber-v0"
    assert ev["temperature"] == 1.0 and ev["checkpoint"] == "iter_000000002"
    _check_against_episodes(ev)
    # the lines: trained, reference and gain, sampled and greedy, each with its interval
    lines = out.splitlines()
    assert lines[0].startswith("held-out episodes: 16 on seeds training never draws")
    for prefix, head in (("", "  "), ("greedy_", "  greedy: ")):
        lo, hi = ev[prefix + "return_ci95"]
        assert (f"{head}trained   solved {ev[prefix + 'solved_frac']:.3f}" in out
                and f"return {ev[prefix + 'return_mean']:.3f} [{lo:.3f}, {hi:.3f}]" in out)
        lo, hi = ev[f"reference_{prefix}turns_ci95"]
        assert f"turns {ev[f'reference_{prefix}turns_mean']:.3f} [{lo:.3f}, {hi:.3f}]" in out
        lo, hi = ev[prefix + "solved_frac_gain_ci95"]
        assert (f"{head}gain      solved {ev[prefix + 'solved_frac_gain']:+.3f} "
                f"[{lo:+.3f}, {hi:+.3f}]") in out
    assert len(lines) == 8 and lines[-1] == f"wrote {guess_run / 'eval.json'}"
    # "after" is the checkpoint's policy: with the in-run evaluation's generator, its
    # sampled episodes are the ones the run's last held-out evaluation played
    last = read_metrics(guess_run)[-1]
    assert ev["solved_frac"] == pytest.approx(last["eval/episode/solved_frac"])
    assert ev["return_mean"] == pytest.approx(last["eval/episode/return_mean"])
    assert ev["turns_mean"] == pytest.approx(last["eval/episode/turns_mean"])
    # ppokit report reads the agent's eval.json: its return, greedy and sampled
    text = held_out(read_metrics_table(guess_run)).text
    assert (f"eval.json: greedy_return_mean {ev['reference_greedy_return_mean']:.3g} → "
            f"{ev['greedy_return_mean']:.3g}") in text


def test_the_reference_is_the_starting_policy(guess_run, evaluated, tmp_path):
    """'Before' is the policy training started from: a fresh start of the same
    configuration, before any iteration, plays the reference's episodes."""
    from ppokit.llm.training.config import LLMConfig
    from ppokit.llm.training.trainer import TokenTrainer

    ev = evaluated[0]
    assert ev["episodes"]["trained"] != ev["episodes"]["reference"]
    saved = json.loads((guess_run / "config.json").read_text())
    cfg = LLMConfig(**{**saved, "iterations": 1}).resolved()
    tr = TokenTrainer(cfg, str(tmp_path / "fresh"), log=lambda *a: None)
    try:
        before = tr.agent.evaluate(tr)  # the in-run evaluation's generator and seeds
    finally:
        tr.close()
    assert ev["reference_solved_frac"] == pytest.approx(before["eval/episode/solved_frac"])
    assert ev["reference_return_mean"] == pytest.approx(before["eval/episode/return_mean"])
    assert ev["reference_turns_mean"] == pytest.approx(before["eval/episode/turns_mean"])


def test_agent_eval_bad_input_is_one_line(guess_run, evaluated, tmp_path, capsys):
    (tmp_path / "notarun").mkdir()
    (tmp_path / "notarun" / "notes.txt").write_text("hello")
    cases = [(["llm", "eval", str(tmp_path / "notarun")], "notarun"),
             (["llm", "eval", str(guess_run), "--env", "ppokit/ToolArithmetic-v0"],
              "--env: this run acts in 'ppokit/GuessNumber-v0'"),
             (["llm", "eval", str(guess_run), "--tools", "ppokit.llm.agents.env:calc"],
              "--tools: " + str(guess_run) + " was trained without tools"),
             (["llm", "eval", str(guess_run), "--reward", "ppokit.llm.agents.env:calc"],
              "its rewards are its environment's"),
             (["llm", "eval", str(guess_run), "--n-episodes", "0"], "--n-prompts")]
    before = (guess_run / "eval.json").read_bytes()  # written by `evaluated`
    for argv, said in cases:
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert said in err and len(err.strip().splitlines()) == 1, (argv, err)
    assert (guess_run / "eval.json").read_bytes() == before  # nothing already saved is lost


def test_tools_are_named_again_never_imported_from_the_run(tmp_path, capsys, monkeypatch):
    (tmp_path / "evaltools_mark.py").write_text(TOOL_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    log = tmp_path / "imports.log"
    assert main(["llm", "train", "--env", "ppokit/ToolArithmetic-v0", "--iterations", "1",
                 "--set", "tools=evaltools_mark:calc", "--set", "tool_format=compact",
                 "--set", "max_turns=3", "--max-new-tokens", "12", "--set", "sft_steps=1",
                 "--set", "prompts_per_iter=2", "--set", "samples_per_prompt=2",
                 "--set", "time_limit=0", "--set", "n_eval_prompts=4", "--run-dir", "t",
                 "--no-progress", "--no-eval"]) == 0
    assert log.read_text() == "imported\n"
    monkeypatch.delitem(sys.modules, "evaltools_mark")
    log.unlink()
    for argv, said in ((["llm", "eval", "t"], "--tools: t calls evaltools_mark:calc, "
                        "imported only when you name them: ppokit llm eval t --tools "
                        "evaltools_mark:calc"),
                       (["llm", "eval", "t", "--tools", "evaltools_mark:other"],
                        "--tools: this run calls evaltools_mark:calc, not evaltools_mark:other")):
        capsys.readouterr()
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert said in err and len(err.strip().splitlines()) == 1, err
    assert not log.exists() and not (tmp_path / "t" / "eval.json").exists()
    assert main(["llm", "eval", "t", "--tools", "evaltools_mark:calc"]) == 0
    assert log.read_text() == "imported\n"  # imported because this command names it
    ev = json.loads((tmp_path / "t" / "eval.json").read_text())
    assert ev["n_episodes"] == 4 and ev["env"] == "ppokit/ToolArithmetic-v0"
    _check_against_episodes(ev)


def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def test_an_environment_given_in_python_is_passed_again(tmp_path, capsys):
    from _text_envs import Countdown  # a user's own gymnasium.Env with Text spaces
    from ppokit.llm import evaluate_lm_run, train_agent

    rd = tmp_path / "py"
    run = train_agent(Countdown, run_dir=rd, tools=[add], iterations=1, prompts_per_iter=2,
                      samples_per_prompt=2, max_turns=3, time_limit=0, sft_steps=1,
                      n_eval_prompts=6, tool_format="compact", log=lambda *a: None)
    capsys.readouterr()
    assert main(["llm", "eval", str(rd)]) == 2
    err = capsys.readouterr().err
    assert "an environment given in Python" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(Exception, match="functions given in Python"):
        evaluate_lm_run(str(rd), env=Countdown, log=lambda *a: None)
    ev = evaluate_lm_run(str(rd), env=Countdown, tools=[add], log=lambda *a: None)
    assert json.loads((rd / "eval.json").read_text()) == json.loads(json.dumps(ev))
    _check_against_episodes(ev)
    again = evaluate_lm_run(str(rd), env=Countdown, tools=[add], log=lambda *a: None)
    assert again["episodes"] == ev["episodes"]  # seeded sampling, greedy: the same episodes
    assert run.evaluate() == ev  # the run train_agent returns plays the same


def test_mean_interval_of_counts_is_not_a_proportion():
    from ppokit.core.stats import mean_interval

    assert mean_interval([1, 1, 1, 1]) != (1.0, 1.0)  # 0/1 values: Wilson's
    assert mean_interval([1, 1, 1, 1], binary=False) == (1.0, 1.0)
    assert _close(mean_interval([0, 1, 1, 0], binary=False), _normal([0, 1, 1, 0]))
