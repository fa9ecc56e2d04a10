"""Aggregation of ``bench.learning``'s result files: the table and figure of
docs/benchmarks.md, and the quick net's verdicts.

Per task: ppokit's final evaluations over seeds (mean and a 95 % Student-t interval of the
mean), each reference with its n and budget, the ratio of means, whether ppokit is within
or above the reference (its interval's upper end at least the reference's mean less the
reference's published standard deviation; for the equal-budget SB3 runs, whose seeds
give an interval of their own, its lower end), the steps and wall seconds at which the mean
evaluation curve first reaches 90 % of the way from a random policy's score to the
reference's, and wall seconds per million steps on this machine.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from bench.learning_tasks import TASKS, Task, random_key, slug

# two-sided 95 % Student-t critical values by degrees of freedom
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262, 10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}
BEGIN, END = "<!-- table:begin -->", "<!-- table:end -->"


def t_interval(values: list[float]) -> tuple[float, float, float]:
    """``(mean, low, high)``: the mean of ``values`` and its 95 % Student-t interval
    (the interval is the mean itself for one value)."""
    n = len(values)
    m = statistics.fmean(values)
    if n < 2:
        return m, m, m
    df = n - 1
    t = _T95.get(df) or next((v for k, v in sorted(_T95.items()) if k >= df), 1.96)
    h = t * statistics.stdev(values) / math.sqrt(n)
    return m, m - h, m + h


def load_results(results: Path, t: Task) -> list[dict]:
    d = results / slug(t)
    return [json.loads(p.read_text()) for p in sorted(d.glob("seed*.json"))] if d.is_dir() \
        else []


def load_references(path: Path) -> tuple[dict, dict[str, list[dict]]]:
    """The sources and, by ppokit's environment id, the published rows with a number
    (superseded tables, whose source key says ``legacy``, left out)."""
    if not path.exists():
        return {}, {}
    data = json.loads(path.read_text())
    by_task: dict[str, list[dict]] = {}
    for row in data.get("rows", []):
        if row.get("mean") is not None and "legacy" not in row["source"]:
            by_task.setdefault(row["task"], []).append(row)
    return data.get("sources", {}), by_task


SB3_SOURCE = "SB3 run here (same budget, ppokit's preset values)"


def sb3_reference(results: Path | None, t: Task) -> dict | None:
    """The reference row of the equal-budget Stable-Baselines3 runs of ``t``
    (``bench/learning_sb3.py``): the mean, standard deviation (ddof 1) and 95 % t-interval
    of their seeds' final evaluations; files at another budget than the task's (reduced
    smoke runs) are left out. None without such files."""
    recs = [r for r in load_results(results, t) if r.get("budget") == t.steps] \
        if results is not None else []
    if not recs:
        return None
    finals = [r["final"]["mean"] for r in recs]
    m, lo, hi = t_interval(finals)
    return {"task": t.env_id, "source": SB3_SOURCE, "mean": m,
            "std": statistics.stdev(finals) if len(finals) > 1 else None,
            "n_seeds": len(finals), "budget_steps": t.steps, "low": lo, "high": hi}


def closest_per_project(refs: list[dict], sources: dict, budget: int) -> list[dict]:
    """One row per project: the one whose budget is nearest ``budget`` (the first on a
    tie), so that a project publishing at 1M and 3M steps is compared at 1M."""
    best: dict[str, dict] = {}
    for ref in refs:
        project = sources.get(ref["source"], {}).get("project", ref["source"])
        gap = abs(math.log(ref["budget_steps"] / budget))
        if project not in best or gap < best[project][0]:
            best[project] = (gap, ref)
    return [r for _, r in best.values()]


def mean_curve(recs: list[dict]) -> tuple[list[float], list[float], list[float], list[float]]:
    """The evaluation curves of several seeds on a common grid of steps (each seed's curve
    held constant between its points): steps, mean, low, high (95 % t-interval)."""
    curves = [r["curve"] for r in recs if r["curve"]]
    if not curves:
        return [], [], [], []
    end = min(c[-1][0] for c in curves)
    grid = sorted({p[0] for c in curves for p in c if p[0] <= end})
    means, lows, highs = [], [], []
    for s in grid:
        vals = [next(p[1] for p in reversed(c) if p[0] <= s) if c[0][0] <= s else c[0][1]
                for c in curves]
        m, lo, hi = t_interval(vals)
        means.append(m)
        lows.append(lo)
        highs.append(hi)
    return grid, means, lows, highs


def time_to(recs: list[dict], target: float) -> tuple[float | None, float | None]:
    """Steps and wall seconds (mean over seeds of each seed's curve) at which a seed's
    evaluation first reaches ``target``; None when some seed never does."""
    steps, secs = [], []
    for r in recs:
        hit = next((p for p in r["curve"] if p[1] >= target), None)
        if hit is None:
            return None, None
        steps.append(hit[0])
        secs.append(hit[2])
    return statistics.fmean(steps), statistics.fmean(secs)


def _fmt(x: float | None, digits: int | None = None) -> str:
    """A score: three decimals under 10, one under 1,000, else whole and grouped."""
    if x is None:
        return "—"
    if x == 0:
        return "0"
    if digits is not None:
        return f"{x:,.{digits}f}"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.1f}" if abs(x) >= 10 else f"{x:.3f}"


def task_row(t: Task, recs: list[dict], refs: list[dict], random_score: float | None) -> dict:
    finals = [r["final"]["mean"] for r in recs]
    m, lo, hi = t_interval(finals)
    # the median over seeds: a run that was paused (SIGSTOP while the machine served other
    # work) counts its stopped hours as wall time, and one such seed would move a mean
    per_m = statistics.median(r["wall_s"] / r["steps"] * 1e6 for r in recs)
    out = {"task": t, "n": len(recs), "mean": m, "low": lo, "high": hi, "wall_per_m": per_m,
           "refs": [], "budget": recs[0]["budget"]}
    for ref in refs:
        # a reference with an interval over seeds (the SB3 runs): the two intervals meet;
        # a published one: the mean less its published standard deviation
        floor = ref["low"] if "low" in ref else ref["mean"] - (ref.get("std") or 0.0)
        within = hi >= floor
        ratio = m / ref["mean"] if ref["mean"] > 0 and m >= 0 else None
        target = ref["mean"] if random_score is None else \
            random_score + 0.9 * (ref["mean"] - random_score)
        steps, secs = time_to(recs, target)
        out["refs"].append({**ref, "within": within, "ratio": ratio, "target": target,
                            "t_steps": steps, "t_secs": secs})
    return out


def cpu_hours(rows: list[dict]) -> float:
    return sum(r["wall_per_m"] * r["budget"] / 1e6 * r["n"] for r in rows) / 3600


# a reference trained for more than this factor more (or fewer) steps than the row is shown
# but compared with caution: the second count of the summary leaves it out
SAME_BUDGET = 2.0


def _same_budget(row: dict) -> list[dict]:
    """The row's references whose budget is within :data:`SAME_BUDGET` of the row's."""
    return [x for x in row["refs"] if x.get("budget_steps")
            and 1 / SAME_BUDGET <= x["budget_steps"] / row["budget"] <= SAME_BUDGET]


def render(rows: list[dict], sources: dict, pending: list[Task]) -> str:
    lines = ["| task | policy | budget | ppokit mean [95 % CI] (n) | reference: mean ± std (n), "
             "budget | ratio | within | 90 % of ref: steps / wall s | wall s / 1M steps |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        t = r["task"]
        ours = f"{_fmt(r['mean'])} [{_fmt(r['low'])}, {_fmt(r['high'])}] ({r['n']})"
        refs = r["refs"] or [None]
        for i, ref in enumerate(refs):
            head = (f"| {t.name} | {t.policy} | {r['budget']:,} | {ours} " if i == 0
                    else "| | | | ")
            if ref is None:
                known = f"; a perfect score is {_fmt(t.solved)}" if t.solved else ""
                lines.append(head + f"| none published{known} | | | | "
                                    f"{_fmt(r['wall_per_m'], 0)} |")
                continue
            src = sources.get(ref["source"], {}).get("project", ref["source"])
            std = f" ± {_fmt(ref['std'])}" if ref.get("std") is not None else ""
            n = ref.get("n_seeds") or "?"
            ci = f" [{_fmt(ref['low'])}, {_fmt(ref['high'])}]" if "low" in ref else ""
            ref_txt = f"{src}: {_fmt(ref['mean'])}{std} ({n}){ci}, {ref['budget_steps']:,}"
            tt = ("not reached" if ref["t_steps"] is None
                  else f"{ref['t_steps']:,.0f} / {ref['t_secs']:,.0f}")
            ratio = "—" if ref["ratio"] is None else f"{ref['ratio']:.2f}"
            lines.append(head + f"| {ref_txt} | {ratio} | "
                         f"{'yes' if ref['within'] else '**no**'} | {tt} | "
                         f"{_fmt(r['wall_per_m'], 0) if i == 0 else ''} |")
    with_ref = [r for r in rows if r["refs"]]
    ok = sum(all(x["within"] for x in r["refs"]) for r in with_ref)
    same = [r for r in rows if _same_budget(r)]
    ok_same = sum(all(x["within"] for x in _same_budget(r)) for r in same)
    lines.append("")
    lines.append(f"Tasks with results: {len(rows)}; with a reference: {len(with_ref)}, of "
                 f"which within or above every reference: {ok}. Counting only references "
                 f"at the row's budget (within a factor of {SAME_BUDGET:g}): {len(same)} "
                 f"tasks with one, {ok_same} within or above every such reference. CPU "
                 f"hours spent on the results above: {cpu_hours(rows):.1f}.")
    if pending:
        lines.append("Tasks without results yet: " + ", ".join(t.name for t in pending) + ".")
    return "\n".join(lines)


def figure(rows: list[dict], results: Path, path: Path, randoms: dict | None = None,
           sb3_results: Path | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(rows)
    cols = min(4, n) or 1
    nrows = math.ceil(n / cols) or 1
    fig, axes = plt.subplots(nrows, cols, figsize=(4 * cols, 3 * nrows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    for ax, r in zip(axes.flat, rows):
        t = r["task"]
        grid, m, lo, hi = mean_curve(load_results(results, t))
        ax.plot(grid, m, color="C0", label=f"ppokit ({r['n']} seeds)")
        ax.fill_between(grid, lo, hi, color="C0", alpha=0.25)
        if (randoms or {}).get(random_key(t)) is not None:
            ax.axhline(randoms[random_key(t)], color="grey", ls=":", lw=1, label="random")
        sb3 = [x for x in load_results(sb3_results, t) if x.get("budget") == t.steps] \
            if sb3_results is not None else []
        if sb3:  # the SB3 runs' own curves (the reference's line is their final mean)
            grid, m, lo, hi = mean_curve(sb3)
            ax.plot(grid, m, color="C3", label=f"SB3 here ({len(sb3)} seeds)")
            ax.fill_between(grid, lo, hi, color="C3", alpha=0.2)
        for i, ref in enumerate(r["refs"]):
            mine = ref["source"] == SB3_SOURCE
            ax.axhline(ref["mean"], color="C3" if mine else f"C{i + 1}", ls="--", lw=1,
                       label="SB3 here, final" if mine else ref["source"])
        ax.set_title(t.name, fontsize=9)
        ax.set_xlabel("environment steps", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6, loc="lower right")
    fig.suptitle("ppokit: mean evaluation return and 95 % interval over seeds", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / nrows))  # a band above the top row's titles
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)


def write_table(results: Path, references: Path, doc: Path, fig_path: Path, *,
                sb3_results: Path | None = None) -> None:
    sources, by_task = load_references(references)
    random_file = references.with_name("random.json")
    randoms = json.loads(random_file.read_text()) if random_file.exists() else {}
    rows, pending = [], []
    for t in TASKS:
        recs = load_results(results, t)
        if not recs:
            pending.append(t)
            continue
        refs = [] if t.sets and not t.published else closest_per_project(
            by_task.get(t.env_id, []), sources, recs[0]["budget"])
        sb3 = sb3_reference(sb3_results, t)
        rows.append(task_row(t, recs, refs + [sb3] * (sb3 is not None),
                             randoms.get(random_key(t))))
    text = render(rows, sources, pending)
    body = doc.read_text() if doc.exists() else f"{BEGIN}\n{END}\n"
    start, stop = body.index(BEGIN) + len(BEGIN), body.index(END)
    doc.write_text(body[:start] + "\n" + text + "\n" + body[stop:])
    if rows:
        figure(rows, results, fig_path, randoms, sb3_results)
    print(text)


def quick_verdicts(tasks: list[Task], seeds: list[int], results: Path, log) -> bool:
    """Print each quick task's final evaluation per seed against its threshold; True when
    every seed of every task reaches it."""
    ok = True
    log(f"{'task':<36}{'threshold':>10}  per seed (final evaluation)   verdict")
    for t in tasks:
        recs = {r["seed"]: r for r in load_results(results, t)}
        got = [recs[s]["final"]["mean"] if s in recs else None for s in seeds]
        passed = all(g is not None and g >= t.quick.threshold for g in got)
        ok &= passed
        shown = ", ".join("missing" if g is None else f"{g:.3f}" for g in got)
        margin = min((g - t.quick.threshold for g in got if g is not None), default=None)
        log(f"{t.name:<36}{t.quick.threshold:>10g}  {shown:<30}"
            f"{'pass' if passed else 'FAIL'}"
            + (f" (margin {margin:+.3g})" if margin is not None else ""))
    return ok
