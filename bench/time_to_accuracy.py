"""Time to accuracy: held-out accuracy against training wall time, ppokit's rows and TRL's.

    python -m bench.time_to_accuracy run --seeds 0-2                   # every row
    python -m bench.time_to_accuracy run --rows ppokit,trl --seeds 0     # some rows
    python -m bench.time_to_accuracy table                               # table + figure

SmolLM2-135M-Instruct (``ppokit llm fetch smollm2-135m-instruct``) trains GRPO on the
built-in ``numbers`` task, with the same held-out problems scored on every side, by four
rows:

* ``ppokit``: ppokit's trainer with its own sampler (the synchronous loop);
* ``ppokit-vllm``: the same trainer, vLLM generating (``rollout_engine = "vllm"``, in the
  run's number format, truncated importance weights on the sampler/trainer mismatch);
* ``ppokit-async-vllm``: as ``ppokit-vllm``, generation one policy version ahead of
  training (``max_staleness = 1``);
* ``trl``: TRL's ``GRPOTrainer`` (``bench/_tta_worker.py``).

What is equal on every side: the model, the task, the held-out rows and how they are
scored (ppokit's ``score_policy`` at the training temperature with the trainer's
evaluation seed, every ``eval_every`` generations), prompts per generation, completions
per prompt, completion cap, temperature, learning rate, LoRA rank and α, minibatches per
generation, passes, clip range, gradient clipping, β = 0 (no KL term), and the number
format (``--precision``: bf16, the default, is TRL's ``bf16=True`` and ppokit's
``precision = bf16``, each library's own meaning of it, docs/performance.md). ppokit's other
settings are its SmolLM2 defaults; TRL's are its own (printed by ``table``). Each (row,
seed) trains for ``--budget`` seconds of training time, the clock stopped while the
held-out set is scored; ``--threads`` torch threads each (the vLLM rows' engine runs in a
process of its own beside them).

Each finished run writes ``docs/benchmarks/time_to_accuracy/<row>/seed<N>.json`` (or under
``--results``: the curve, the commit, the settings, the CPU and its load); a run whose file
exists is skipped;
a ppokit row stopped part-way continues from its checkpoint (``--resume``), a TRL run
starts again. ``table`` reads only those files: the time to reach ``--target`` held-out
accuracy and the accuracy at the end of the budget, each as a mean with a 95 % interval
over seeds, TRL's time over each ppokit row's, and one figure. One table holds runs of one
budget, thread count, number format and CPU (with and without AVX-512 the formats and
ppokit's kernels run at very different speeds): runs from another machine go to a folder
of their own (``--results``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "benchmarks" / "time_to_accuracy"
MODEL = "smollm2-135m-instruct"
ROWS = ("ppokit", "ppokit-vllm", "ppokit-async-vllm", "trl")
# the settings every side shares beyond ppokit's SmolLM2 defaults (which TRL's
# configuration copies: bench/_tta_worker.py, trl_config)
SHARED = {"kl_coef": 0.0, "n_eval_prompts": 128, "eval_every": 5}
# training seconds per run: every row reached 0.5 within 900 s in the first measurement
# (docs/benchmarks/time_to_accuracy_2400s, a budget of 2,400 s)
BUDGET_S = 1200.0
VLLM = ("--rollout-engine", "vllm", "--set", "rollout_is=truncate")
EXTRA = {"ppokit": (), "ppokit-vllm": VLLM, "ppokit-async-vllm": VLLM + ("max_staleness=1",)}


def parse_seeds(spec: str) -> list[int]:
    out: list[int] = []
    for part in spec.split(","):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b or a) + 1))
    return out


def result_path(row: str, seed: int, results: Path = RESULTS) -> Path:
    return results / row / f"seed{seed}.json"


def _env(threads: int = 2) -> dict:
    # the thread count is the bench's, not chosen from the machine's load at the start
    # (ppokit's trainer would use fewer where another process was busy at that moment)
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1",
               OMP_NUM_THREADS=str(threads), PPOKIT_THREADS=str(threads))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT),
                                         env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def ppokit_command(row: str, python: str, model: str, seed: int, budget: float,
                   run_dir: Path, precision: str = "bf16") -> list[str]:
    """The ``ppokit llm train`` invocation of one ppokit row (or ``--resume`` of it)."""
    head = [python, "-m", "ppokit", "llm", "train"]
    if (run_dir / "checkpoints").is_dir():
        return head + ["--resume", str(run_dir)]
    # vLLM samples in the run's number format (set apart: its own sampler_precision)
    sets = [f"{k}={v}" for k, v in SHARED.items()] + [f"precision={precision}"] + (
        [f"sampler_precision={precision}"] if "vllm" in row else [])
    extra = list(EXTRA[row])
    if "--set" in extra:  # one --set with every key
        i = extra.index("--set")
        sets += extra[i + 1:]
        extra = extra[:i]
    return head + ["--model", model, "--seed", str(seed), "--time-limit", str(budget),
                   "--run-dir", str(run_dir), "--no-eval", "--checkpoint-every", "5",
                   *extra, "--set", *sets]


class Refused(SystemExit):
    """Input the bench will not use: its message on stderr, exit status 2 (as a bad
    argument's)."""

    def __init__(self, message: str):
        print(f"python -m bench.time_to_accuracy: {message}", file=sys.stderr)
        super().__init__(2)
        self.message = message

    def __str__(self) -> str:
        return self.message


def check_resumable(run_dir: Path, budget: float, precision: str) -> None:
    """A ppokit row's run directory with checkpoints is resumed, with the settings it was
    started with: it must have been started with this budget and number format (an error
    names the directory otherwise, rather than a result file that misstates them)."""
    if not (run_dir / "checkpoints").is_dir():
        return
    try:
        cfg = json.loads((run_dir / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise Refused(f"{run_dir}: has checkpoints but no readable config.json ({exc}); "
                         f"move it away to start this run again") from None
    have = (cfg.get("time_limit"), cfg.get("precision"))
    if have != (budget, precision):
        raise Refused(f"{run_dir}: started with time_limit {have[0]} and precision "
                         f"{have[1]}, not {budget:g} and {precision}: move it away (or "
                         f"pass --out elsewhere) to start this run again")


def ppokit_curve(run_dir: Path) -> list[dict]:
    """The held-out points of a ppokit run's ``metrics.jsonl``: training seconds (the
    trainer's ``wall_time``, which leaves its evaluations out), iteration, accuracy."""
    out = []
    with open(run_dir / "metrics.jsonl") as f:
        for line in f:
            rec = json.loads(line)
            if "eval/score_mean" in rec:
                out.append({"train_s": rec["wall_time"], "iteration": rec["iteration"],
                            "accuracy": rec["eval/score_mean"], "n": SHARED["n_eval_prompts"]})
    return out


def _worker(mode: str, python: str, model: str, seed: int, out: Path, **kw) -> dict:
    cmd = [python, "-m", "bench._tta_worker", mode, "--model", model, "--seed", str(seed),
           "--shared", json.dumps(SHARED), "--out", str(out)]
    for k, v in kw.items():
        cmd += [f"--{k}", str(v)]
    subprocess.run(cmd, check=True, cwd=ROOT, env=_env())
    return json.loads(out.read_text())


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine() -> dict:
    """The CPU a run trained on: its model name and whether it has AVX-512 and AVX-512
    BF16 (the number formats and ppokit's kernels run at very different speeds without
    them, so runs from different CPUs do not share a table)."""
    name, flags = "unknown", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and name == "unknown":
                    name = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return {"cpu": name, "avx512": "avx512f" in flags, "avx512_bf16": "avx512_bf16" in flags,
            "cores": os.cpu_count()}


def machine_label(m: dict | None) -> str:
    if not m:
        return "a machine not recorded"
    isa = "AVX-512" + (" with BF16" if m["avx512_bf16"] else "") if m["avx512"] else "AVX2"
    return f"{m['cpu']} ({isa}, {m['cores']} cores)"


def start_point(python: str, model: str, seed: int, results: Path) -> dict:
    """The starting model's held-out accuracy for ``seed`` (the point at 0 s of every
    row), computed once."""
    path = results / "start" / f"seed{seed}.json"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        _worker("start", python, model, seed, path)
    return json.loads(path.read_text())


def run_one(row: str, seed: int, a) -> Path:
    """Train one (row, seed) for ``a.budget`` seconds and write its result file."""
    path = result_path(row, seed, a.results)
    if path.exists():
        print(f"{row} seed {seed}: {path} exists, skipped", flush=True)
        return path
    start = start_point(a.python, a.model, seed, a.results)
    python = a.vllm_python if "vllm" in row else a.python
    t0 = time.time()
    if row == "trl":
        tmp = Path(a.out) / "trl" / f"seed{seed}.json"
        tmp.parent.mkdir(parents=True, exist_ok=True)
        got = _worker("trl", python, a.model, seed, tmp, budget=a.budget,
                      precision=a.precision, threads=a.threads)
        curve, notes = got.pop("curve"), got
    else:
        run_dir = Path(a.out) / row / f"seed{seed}"
        check_resumable(run_dir, a.budget, a.precision)
        cmd = ppokit_command(row, python, a.model, seed, a.budget, run_dir, a.precision)
        print(" ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, cwd=ROOT, env=_env(a.threads))
        curve, notes = ppokit_curve(run_dir), {"command": cmd}
    point0 = {"train_s": 0.0, "iteration": 0, **start}
    rec = {"row": row, "seed": seed, "budget_s": a.budget, "threads": a.threads,
           "precision": a.precision,
           "curve": [point0] + curve, "notes": notes, "shared": SHARED,
           "commit": _commit(), "machine": machine(), "wall_s": round(time.time() - t0, 1),
           "load_1min": round(os.getloadavg()[0], 2),
           "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec, indent=1))
    print(f"{row} seed {seed}: final accuracy {rec['curve'][-1]['accuracy']:.3f} -> {path}",
          flush=True)
    return path


# ------------------------------------------------------------------ the table
def time_to(curve: list[dict], target: float) -> float | None:
    """Training seconds at the first held-out point at or above ``target`` (None: never)."""
    for p in curve:
        if p["accuracy"] >= target:
            return p["train_s"]
    return None


def mean_ci(xs: list[float], lo: float = 0.0,
            hi: float = float("inf")) -> tuple[float, float, float]:
    """Mean and a 95 % t interval over seeds (the mean alone for one value), the interval
    cut to the values the quantity can take (``lo``..``hi``: a time is never negative, an
    accuracy never above 1; with two seeds the t interval is 12.7 standard errors wide)."""
    from bench.learning_table import t_interval

    m, a, b = t_interval(xs)
    return m, max(a, lo), min(b, hi)


def summarise(results: Path, target: float) -> dict:
    """Per row: the seeds, each seed's time to ``target`` and final accuracy. Every file
    must have one budget, thread count, number format and machine (an error names the file
    that differs; a file from before ``precision`` was recorded ran in fp32)."""
    out, first = {}, None
    for row in ROWS:
        paths = sorted((results / row).glob("seed*.json"))
        recs = [json.loads(p.read_text()) for p in paths]
        for p, r in zip(paths, recs):
            got = (r["budget_s"], r["threads"], r.get("precision", "fp32"),
                   machine_label(r.get("machine")))
            first = first or (got, p)
            if got != first[0]:
                raise Refused(f"{p}: budget {got[0]:g} s, {got[1]} threads, "
                              f"{got[2]}, on {got[3]}, but {first[1]} has {first[0][0]:g} "
                              f"s, {first[0][1]} threads, {first[0][2]}, on {first[0][3]}: "
                              f"one table compares runs of one budget, thread count, number "
                              f"format and machine (move the other files to a folder of "
                              f"their own)")
        if recs:
            out[row] = {"seeds": [r["seed"] for r in recs], "setup": first[0],
                        "times": [time_to(r["curve"], target) for r in recs],
                        "finals": [r["curve"][-1]["accuracy"] for r in recs],
                        "budget_s": recs[0]["budget_s"], "notes": recs[0]["notes"]}
    return out


def table(summary: dict, target: float) -> str:
    head = (f"| row | seeds | time to {target:.2f} held-out accuracy, s (seeds reaching) "
            "| accuracy at the budget | TRL's time / this row's |")
    lines = [head, "|---|---|---|---|---|"]
    trl = summary.get("trl")
    trl_reached = [t for t in trl["times"] if t is not None] if trl else []
    for row, s in summary.items():
        reached = [t for t in s["times"] if t is not None]
        tt = ("not reached" if not reached else
              "{:,.0f} [{:,.0f}, {:,.0f}]".format(*mean_ci(reached)))
        fm, flo, fhi = mean_ci(s["finals"], 0.0, 1.0)
        ratio = ""
        if row != "trl" and reached and trl:
            mine = sum(reached) / len(reached)
            ratio = (f"{sum(trl_reached) / len(trl_reached) / mine:.2f}×" if trl_reached
                     else f"> {trl['budget_s'] / mine:.2f}× (TRL did not reach it)")
        lines.append(f"| {row} | {len(s['seeds'])} | {tt} ({len(reached)} of "
                     f"{len(s['times'])}) | {fm:.3f} [{flo:.3f}, {fhi:.3f}] | {ratio} |")
    return "\n".join(lines)


def plot(results: Path, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for row in ROWS:
        recs = [json.loads(p.read_text()) for p in sorted((results / row).glob("seed*.json"))]
        for i, r in enumerate(recs):
            xs = [p["train_s"] / 60 for p in r["curve"]]
            ys = [p["accuracy"] for p in r["curve"]]
            ax.plot(xs, ys, color=f"C{ROWS.index(row)}", alpha=0.8,
                    label=row if i == 0 else None)
    ax.set_xlabel("training time (minutes; held-out scoring left out)")
    ax.set_ylabel("held-out accuracy")
    ax.set_title("SmolLM2-135M-Instruct, GRPO on numbers: one line per seed")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def write_table(results: Path, target: float) -> str:
    summary = summarise(results, target)
    if not summary:
        return "no result files yet"
    budget, threads, precision, where = next(iter(summary.values()))["setup"]
    text = (f"Budget {budget:,.0f} s of training per run, {threads} torch threads, "
            f"{precision}, on {where}.\n\n" + table(summary, target))
    trl = summary.get("trl", {}).get("notes", {})
    if trl:
        text += (f"\n\nTRL's own settings: loss `{trl.get('loss_type')}`, rewards scaled "
                 f"per `{trl.get('scale_rewards')}`, bf16 {trl.get('bf16')}, gradient "
                 "checkpointing off; ppokit: its SmolLM2 defaults, β 0 on both sides.")
    plot(results, results / "curves.png")
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.time_to_accuracy",
                                 description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="train and score (resumable)")
    r.add_argument("--rows", default=",".join(ROWS))
    r.add_argument("--seeds", default="0-2")
    r.add_argument("--budget", type=float, default=BUDGET_S,
                   help="training seconds per run (default %(default)g)")
    r.add_argument("--threads", type=int, default=2)
    r.add_argument("--eval-every", type=int, default=SHARED["eval_every"],
                   help="generations between held-out scores (default %(default)s)")
    r.add_argument("--model", default=MODEL)
    r.add_argument("--python", default=sys.executable)
    r.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    r.add_argument("--precision", default="bf16", choices=("fp32", "bf16"),
                   help="the number format of every side (default bf16)")
    r.add_argument("--out", default=str(ROOT / "runs" / "bench-tta"),
                   help="run directories (a ppokit row's existing one is resumed)")
    r.add_argument("--results", type=Path, default=RESULTS)
    t = sub.add_parser("table", help="the table and figure from the result files")
    t.add_argument("--target", type=float, default=0.5)
    t.add_argument("--results", type=Path, default=RESULTS)
    a = ap.parse_args(argv)
    if a.cmd == "table":
        print(write_table(a.results, a.target))
        return 0
    SHARED["eval_every"] = a.eval_every
    from ppokit.llm.modeling.fetch import resolve_model

    a.model = resolve_model(a.model)
    if not Path(a.model, "config.json").exists():
        ap.error(f"--model: {a.model} is not a model directory (ppokit llm fetch "
                 f"{MODEL} fetches the default)")
    rows = a.rows.split(",")
    bad = [x for x in rows if x not in ROWS]
    if bad:
        ap.error(f"--rows: unknown {bad}; the rows are {', '.join(ROWS)}")
    if any("vllm" in x for x in rows) and not Path(a.vllm_python).exists():
        ap.error(f"--vllm-python: {a.vllm_python} does not exist (make vllm builds it)")
    for seed in parse_seeds(a.seeds):
        for row in rows:
            run_one(row, seed, a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
