"""Do ``ppokit report`` and ``ppokit check`` name what is wrong, and only that? A corpus of
real runs: every documented default command at a small budget (healthy) and runs with one
planted failure each, then a confusion table of the codes found.

    python -m bench.diagnostics [--dir SCRATCH] [--only healthy|planted] [--jobs N]
                                [--names a,b,...] [--json FILE]

Each run is one fresh process (``python -m ppokit ...`` or a short Python program for the
SB3-style API) with one torch thread, writing into ``SCRATCH/NAME`` (default
``runs/diagnostics``, not committed); a run whose directory holds ``corpus.json`` is
complete and is not run again, so an interrupted corpus resumes. Then every run directory
is read by ``ppokit.diagnose.report`` (a check is the run: its ``--json`` output is read),
and the table gives, per run, the code it should be named by (``-`` for a healthy run),
the codes found (FAIL and WARN: a report's errors and warnings, a check's FAIL and WARN),
and the counts. The targets, printed at the end: on healthy runs no FAIL and no finding
saying the run did not learn, every WARN listed in docs/checks.md; on planted runs at
least 90 % named with the right code. The planted bugs are in
``bench/_diagnostics_plants.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLANTS = "bench._diagnostics_plants"
NOT_LEARNED = ("nothing was learned", "never moves", "did not learn")
# the codes a planted step-size bug may be named by: they all say "the steps are too large"
TOO_LARGE = {"kl-high", "clipfrac-high", "kl-rising-return-flat", "entropy-collapse",
             "return-collapse", "kl-ref-blowup", "lm-entropy-collapse", "metrics-nonfinite"}
# WARNs a healthy run gives, each justified in docs/checks.md ("Warnings on healthy runs")
EXPECTED_WARN = {
    ("check-smollm2", "lm-reward-constant"): "SmolLM2 solves few numbers problems at "
    "temperature 0.7: most sampled groups score all-equal (the recipe's known weakness)",
    ("halfcheetah", "clipfrac-high"): "the RL-zoo preset (clip 0.1, 20 epochs of 8 "
    "minibatches) clips half the samples each update by design",
}


@dataclass
class Run:
    """One corpus entry: ``steps`` are ppokit argument lists (or ``["-c", CODE]`` for a
    Python program), run in order; ``expect`` the codes that name the planted bug (empty:
    healthy); ``check``: the last step is a ``ppokit check --json`` whose output is the
    result."""

    name: str
    steps: list[list[str]]
    expect: set = field(default_factory=set)
    check: bool = False
    needs: str | None = None   # a module that must be importable, else the run is skipped

    @property
    def planted(self) -> bool:
        return bool(self.expect)


def env(name, env_id, steps, *sets, seed=0, expect=(), extra=()):
    argv = ["train", "--env", env_id, "--total-steps", str(steps), "--seed", str(seed),
            "--no-progress", "--eval-episodes", "0", "--set", "tensorboard=false",
            *[a for s in sets for a in ("--set", s)], *extra]
    return Run(name, [argv], set(expect))


def llm(name, iters, *flags, expect=()):
    return Run(name, [["llm", "train", "--iterations", str(iters), *flags]], set(expect))


def check(name, *flags, expect=(), needs=None):
    return Run(name, [["check", *flags, "--json"]], set(expect), check=True, needs=needs)


def _sb3(env_id, steps):
    return ["-c", "import sys; from ppokit import PPO; "
            f"PPO('MlpPolicy', {env_id!r}, seed=0, run_dir=sys.argv[1] + '/run')"
            f".learn({steps})"]


def healthy() -> list[Run]:
    cp = "CartPole-v1"
    runs = [env(f"cartpole-s{s}", cp, 20_000, seed=s) for s in range(6)]
    runs += [env(f"cartpole-{a}", cp, 20_000, extra=("--algo", a))
             for a in ("a2c", "reinforce", "ppo-kl")]
    runs += [env("acrobot", "Acrobot-v1", 30_000), env("pendulum", "Pendulum-v1", 20_000),
             env("lunarlander", "LunarLander-v3", 20_000),
             env("cartpole-novel", "ppokit/CartPoleNoVel-v1", 20_000),
             env("halfcheetah", "HalfCheetah-v5", 5_000),
             env("cartpole-short", cp, 2_000),
             env("cartpole-eval-every", cp, 20_000, "eval_every=10", extra=(
                 "--eval-episodes", "5")),
             env("solved-early-s0", f"{PLANTS}:SolvedEarly-v0", 30_000),
             env("solved-early-s1", f"{PLANTS}:SolvedEarly-v0", 30_000, seed=1),
             Run("cartpole-seeds", [["train", "--env", cp, "--total-steps", "15000",
                                     "--seeds", "0-2", "--no-progress", "--eval-episodes",
                                     "0", "--set", "tensorboard=false"]]),
             Run("cartpole-resumed", [
                 ["train", "--env", cp, "--total-steps", "10000", "--no-progress",
                  "--eval-episodes", "0", "--set", "tensorboard=false"],
                 ["train", "--resume", "{run}", "--total-steps", "20000", "--no-progress",
                  "--eval-episodes", "0"]]),
             Run("sb3-cartpole", [_sb3(cp, 20_000)]),
             Run("sb3-pendulum", [_sb3("Pendulum-v1", 8_000)])]
    runs += [llm(f"llm-{a}", 24, "--algo", a) for a in
             ("ppo", "grpo", "dr-grpo", "rloo", "reinforce++", "gspo", "cispo", "dapo")]
    runs += [llm("llm-arith-ppo", 24, "--task", "arithmetic"),
             llm("llm-arith-grpo", 24, "--task", "arithmetic", "--algo", "grpo"),
             llm("llm-eval-every", 24, "--eval-every", "6"),
             llm("llm-short", 6), llm("llm-seed1", 24, "--seed", "1"),
             Run("llm-resumed", [["llm", "train", "--iterations", "12"],
                                 ["llm", "train", "--resume", "{run}", "--iterations", "24"]]),
             llm("agent-guess", 16, "--env", "ppokit/GuessNumber-v0", "--set", "max_turns=8"),
             llm("agent-tools", 16, "--env", "ppokit/ToolArithmetic-v0", "--set",
                 "tools=ppokit.llm.agents.env:calc", "--set", "tool_format=compact",
                 "--set", "max_turns=3", "--max-new-tokens", "12"),
             check("check-default"), check("check-lm", "--lm"),
             check("check-env-cartpole", "--env", cp),
             check("check-env-solved", "--env", f"{PLANTS}:SolvedEarly-v0"),
             check("check-smollm2", "--model", "smollm2-135m-instruct",
                   needs="model:smollm2-135m-instruct")]
    return runs


def planted() -> list[Run]:
    cp, lm_lr = "CartPole-v1", 2e-4  # the built-in model's default learning rate
    runs = []
    for s in range(3):
        runs += [env(f"env-lr-x100-s{s}", cp, 20_000, "learning_rate=0.1", seed=s,
                     expect=TOO_LARGE),
                 env(f"env-lr-div100-s{s}", cp, 20_000, "learning_rate=1e-5", seed=s,
                     expect={"clipfrac-zero"})]
    # a learning rate 50× the preset's: the policy turns deterministic within a few
    # updates, long before it balances the pole
    runs += [env(f"env-entropy-collapse-s{s}", cp, 20_000, "learning_rate=0.05", seed=s,
                 expect={"entropy-collapse"}) for s in range(2)]
    runs += [env("env-frozen-policy", cp, 20_000, "learning_rate=1e-12",
                 expect={"clipfrac-zero", "return-flat"}),
             env("env-action-independent", f"{PLANTS}:ActionIndependent-v0", 30_000,
                 expect={"return-flat"}),
             env("env-value-divergence", f"{PLANTS}:HugeReward-v0", 20_000,
                 "normalize_reward=false", expect={"value-loss-divergence"}),
             check("check-truncation-as-termination", "--env",
                   f"{PLANTS}:TimeLimitTerminated-v0", "--no-policy",
                   expect={"time-limit-terminated"}),
             check("check-huge-rewards", "--env", f"{PLANTS}:HugeReward-v0", "--no-policy",
                   expect={"reward-scale"})]
    rw = f"--reward={PLANTS}:"
    runs += [llm("llm-lr-x100", 24, "--learning-rate", str(100 * lm_lr), expect=TOO_LARGE),
             llm("llm-lr-div100", 24, "--learning-rate", str(lm_lr / 100),
                 expect={"clipfrac-zero", "reward-flat"}),
             llm("llm-kl-blowup", 24, "--learning-rate", "5e-3", "--kl-mode", "none",
                 expect={"kl-ref-blowup"}),
             llm("llm-entropy-collapse", 24, "--learning-rate", "5e-3", "--n-epochs", "8",
                 "--kl-mode", "none", expect={"lm-entropy-collapse", "kl-ref-blowup",
                                              "clipfrac-high"}),
             llm("llm-length-exploit", 24, rw + "length_bonus",
                 expect={"length-explosion", "length-reward-coupling"}),
             llm("llm-format-exploit", 24, f"--reward={PLANTS}:reverse,{PLANTS}:bang_bonus",
                 expect={"reward-hacking"}),
             llm("llm-dead-groups", 24, "--algo", "grpo", rw + "never_earned",
                 expect={"zero-spread-groups", "reward-flat"}),
             llm("llm-ignores-completion", 24, "--algo", "grpo", rw + "ignores_completion",
                 expect={"zero-spread-groups", "reward-flat"}),
             llm("llm-frozen-policy", 24, "--learning-rate", "1e-12",
                 expect={"clipfrac-zero", "reward-flat"}),
             llm("llm-sampler-mismatch", 24, "--sampler-precision", "bf16",
                 expect={"sampler-mismatch"}),
             llm("llm-truncation", 24, "--max-new-tokens", "2", expect={"truncation-high"}),
             check("check-ignores-completion", "--lm", "--algo", "grpo",
                   rw + "ignores_completion", expect={"lm-reward-constant"}),
             check("check-constant-reward", "--lm", rw + "constant",
                   expect={"lm-reward-constant"}),
             check("check-group-of-one", "--lm", "--algo", "grpo", "--samples-per-prompt",
                   "1", expect={"lm-group-size"}),
             check("check-kl-without-term", "--lm", "--kl-coef", "0.1", "--kl-mode", "none",
                   expect={"lm-kl-reference"}),
             check("check-truncating-cap", "--lm", "--max-new-tokens", "2",
                   expect={"lm-truncation"}),
             Run("check-template-drops-prompt", [["-c", DROPPING_TEMPLATE], [
                 "check", "--model", "{dir}/model", "--prompts", "{dir}/prompts.jsonl",
                 "--reward", f"{PLANTS}:reverse", "--max-new-tokens", "8", "--no-labels",
                 "--json"]],
                 {"lm-chat-template"}, check=True),
             llm("agent-one-turn", 16, "--env", "ppokit/GuessNumber-v0", "--set",
                 "max_turns=1", expect={"episodes-truncated"}),
             llm("agent-failing-tool", 16, "--env", "ppokit/ToolArithmetic-v0", "--set",
                 f"tools={PLANTS}:calc", "--set", "tool_format=compact", "--set",
                 "max_turns=3", "--max-new-tokens", "12", expect={"tool-failures"})]
    return runs


# the built-in model saved with a chat template that renders only the system message
DROPPING_TEMPLATE = r"""
import json, sys, os
from ppokit.llm.modeling.models import build_char_tokenizer, build_tiny_model, save_policy
d = sys.argv[1]
tok = build_char_tokenizer()
tok.chat_template = ("{% for m in messages %}{% if m['role'] == 'system' %}"
                     "{{ m['content'] }}{% endif %}{% endfor %}>")
save_policy(build_tiny_model(tok, seed=0), tok, os.path.join(d, "model"))
with open(os.path.join(d, "prompts.jsonl"), "w") as f:
    for n in ("381", "90417", "5527", "662014", "27", "1234", "808", "4471"):
        f.write(json.dumps({"prompt": [{"role": "user", "content": n}]}) + "\n")
"""


def _available(run: Run) -> str | None:
    """Why ``run`` cannot run here (None: it can)."""
    if run.needs and run.needs.startswith("model:"):
        from ppokit.llm.modeling.fetch import cached_model_dir

        if not Path(cached_model_dir(run.needs[6:])).is_dir():
            return f"{run.needs[6:]} is not fetched (ppokit llm fetch)"
    return None


def execute(run: Run, root: Path) -> dict:
    """Run ``run`` into ``root/NAME`` unless it is complete; its ``corpus.json``."""
    d = root / run.name
    done = d / "corpus.json"
    if done.is_file():
        return json.loads(done.read_text())
    why = _available(run)
    if why:
        return {"skipped": why}
    d.mkdir(parents=True, exist_ok=True)
    envv = {**os.environ, "OMP_NUM_THREADS": "1", "PPOKIT_THREADS": "1",
            "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    t0, rc, out = time.monotonic(), 0, ""
    for i, step in enumerate(run.steps):
        step = [a.replace("{run}", str(d / "run")).replace("{dir}", str(d)) for a in step]
        if step[0] == "-c":
            argv = [sys.executable, *step, str(d)]
        else:
            argv = [sys.executable, "-m", "ppokit", *step]
            if not run.check and "--resume" not in step:
                argv += ["--run-dir", str(d / "run")]
        p = subprocess.run(argv, cwd=d, env=envv, capture_output=True, text=True)
        rc, out = p.returncode, p.stdout
        (d / f"step{i}.log").write_text(p.stdout + p.stderr)
        if rc not in (0, 1):
            break
    res = {"rc": rc, "seconds": round(time.monotonic() - t0, 1)}
    if run.check:
        res["check"] = out
    done.write_text(json.dumps(res))
    return res


def _run_dirs(d: Path) -> list[Path]:
    """The run directories under ``d/run`` (one, or one per seed)."""
    base = d / "run"
    if (base / "metrics.jsonl").is_file():
        return [base]
    return sorted(p.parent for p in base.glob("*/metrics.jsonl"))


def findings(run: Run, res: dict, root: Path) -> dict:
    """``{"codes": {code: FAIL|WARN}, "not_learned": [...], "error": str}``."""
    from ppokit.diagnose import report

    out = {"codes": {}, "not_learned": [], "error": ""}
    if "skipped" in res:
        out["error"] = "skipped: " + res["skipped"]
        return out
    if run.check:
        try:
            data = json.loads(res.get("check") or "")
        except ValueError:
            out["error"] = f"check exited {res['rc']} without JSON"
            return out
        for r in data.get("results", []):
            if r["status"] in ("FAIL", "WARN"):
                out["codes"][r["name"]] = r["status"]
        return out
    dirs = _run_dirs(root / run.name)
    if not dirs:
        out["error"] = f"no metrics (exit {res['rc']})"
    for d in dirs:
        for f in report(d):
            if f.severity in ("error", "warning"):
                out["codes"][f.code] = "FAIL" if f.severity == "error" else "WARN"
            if any(t in f.message.lower() for t in NOT_LEARNED):
                out["not_learned"].append(f.code)
    return out


def table(runs: list[Run], found: dict) -> tuple[str, dict]:
    rows = [f"{'run':34s} {'expected':22s} {'found (FAIL/WARN)':44s} FAIL WARN  ok"]
    tot = {"healthy": 0, "healthy_ok": 0, "planted": 0, "named": 0, "fail_healthy": 0,
           "not_learned": 0, "unexplained_warn": [], "misses": []}
    for run in runs:
        f = found[run.name]
        codes = f["codes"]
        nf = sum(v == "FAIL" for v in codes.values())
        nw = sum(v == "WARN" for v in codes.values())
        shown = ", ".join(f"{c}:{v[0]}" for c, v in sorted(codes.items())) or f["error"] or "-"
        if run.planted:
            ok = bool(set(codes) & run.expect)
            tot["planted"] += 1
            tot["named"] += ok
            if not ok:
                tot["misses"].append(run.name)
            exp = "|".join(sorted(run.expect)) if len(run.expect) <= 2 else "step too large"
        else:
            bad = [c for c in codes if (run.name, c) not in EXPECTED_WARN
                   or codes[c] == "FAIL"]
            ok = not bad and not f["not_learned"] and not f["error"].startswith("no metrics")
            tot["healthy"] += 1
            tot["healthy_ok"] += ok
            tot["fail_healthy"] += nf
            tot["not_learned"] += len(f["not_learned"])
            tot["unexplained_warn"] += [f"{run.name}:{c}" for c in bad if codes[c] == "WARN"]
            exp = "-"
        rows.append(f"{run.name:34s} {exp[:22]:22s} {shown[:44]:44s} {nf:4d} {nw:4d} "
                    f"{'yes' if ok else 'NO':>3s}")
    return "\n".join(rows), tot


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="runs/diagnostics", help="scratch directory of the runs")
    ap.add_argument("--only", choices=("healthy", "planted"))
    ap.add_argument("--jobs", type=int, default=1, help="runs at a time (one thread each)")
    ap.add_argument("--names", help="comma-separated run names (default: all)")
    ap.add_argument("--json", help="also write the per-run results to this file")
    args = ap.parse_args(argv)
    runs = ([] if args.only == "planted" else healthy()) + \
        ([] if args.only == "healthy" else planted())
    if args.names:
        want = set(args.names.split(","))
        runs = [r for r in runs if r.name in want]
    root = Path(args.dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        results = dict(zip([r.name for r in runs], pool.map(lambda r: execute(r, root), runs)))
    found = {r.name: findings(r, results[r.name], root) for r in runs}
    text, tot = table(runs, found)
    print(text)
    print(summary(tot))
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "found": found,
                                               "totals": tot}, indent=1, default=str))
    return 0 if meets_targets(tot) else 1


def summary(tot: dict) -> str:
    share = tot["named"] / tot["planted"] if tot["planted"] else 1.0
    return "\n".join([
        f"healthy: {tot['healthy_ok']}/{tot['healthy']} clean; {tot['fail_healthy']} FAIL, "
        f"{tot['not_learned']} 'did not learn' findings, unexplained WARN: "
        f"{', '.join(tot['unexplained_warn']) or 'none'} (targets: 0, 0, none)",
        f"planted: {tot['named']}/{tot['planted']} named with the right code ({share:.0%}; "
        f"target ≥ 90 %); missed: {', '.join(tot['misses']) or 'none'}"])


def meets_targets(tot: dict) -> bool:
    share = tot["named"] / tot["planted"] if tot["planted"] else 1.0
    return (tot["fail_healthy"] == 0 and tot["not_learned"] == 0
            and not tot["unexplained_warn"] and share >= 0.9)


if __name__ == "__main__":
    sys.exit(main())
