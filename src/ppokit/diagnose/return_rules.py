"""The report's rules about the return (the score, for a language model): whether it moves
at all (``return-flat``, ``reward-flat``), whether the policy moves further each update
while it does not (``kl-rising-return-flat``), and whether a plateau it reached was lost
for good (``return-collapse``). Windows and rank correlations, as every rule
(:mod:`ppokit.diagnose.rules`)."""

from __future__ import annotations

import numpy as np

from .context import SHORT_BUDGET, HeldOut, at_ceiling, budget_share, held_out, run_kind
from .finding import Finding, evidence
from .metrics import MetricsTable
from .thresholds import Thresholds
from .trend import spearman, thirds

__all__ = ["return_metric", "rule_kl_rising_return_flat", "rule_return_flat",
           "rule_reward_flat", "rule_return_collapse"]


def return_metric(table: MetricsTable) -> str | None:
    for name in ("episode_return_mean", "score_mean"):
        if table.has(name):
            return name
    return None


def rule_kl_rising_return_flat(table: MetricsTable, th: Thresholds) -> list[Finding]:
    ret_name = return_metric(table)
    if ret_name is None:
        return []
    kpos, kl = table.series("approx_kl", active_only=True)
    rpos, ret = table.series(ret_name, active_only=True)
    if len(kl) < th.min_iterations or len(ret) < th.min_iterations:
        return []
    k_corr = spearman(kpos, kl)
    k1, _, k3 = thirds(kl)
    if not (k_corr >= th.kl_rise_corr and k3 >= th.kl_floor
            and k3 >= th.kl_rise_factor * max(k1, 1e-12)):
        return []
    r_corr = spearman(rpos, ret)
    r1, _, r3 = thirds(ret)
    iqr = float(np.subtract(*np.quantile(ret, [0.75, 0.25])))
    scale = max(abs(r1), abs(r3), iqr, 1e-8)
    r_rel = (r3 - r1) / scale
    if not (r_corr < th.return_flat_corr and r_rel < th.return_flat_rel):
        return []
    return [Finding(
        "kl-rising-return-flat", "warning",
        f"approx_kl rises over the run (median {k1:.3g} in the first third, {k3:.3g} in the "
        f"last) while {ret_name} does not improve ({r1:.4g} → {r3:.4g}): the policy keeps "
        "moving further per update without getting better. Check the learning rate, the number "
        "of epochs, the advantage scale and the masks before anything else.",
        [evidence(table, "approx_kl", kpos, kl, first_third=k1, last_third=k3,
                   spearman=k_corr),
         evidence(table, ret_name, rpos, ret, first_third=r1, last_third=r3,
                   spearman=r_corr)])]


def rule_return_flat(table: MetricsTable, th: Thresholds) -> list[Finding]:
    """An environment run's return never moves (:func:`_flat`)."""
    return [] if return_metric(table) != "episode_return_mean" else _flat(table, th)


def rule_reward_flat(table: MetricsTable, th: Thresholds) -> list[Finding]:
    """A language-model run's score never moves (:func:`_flat`)."""
    return [] if return_metric(table) != "score_mean" else _flat(table, th)


def _flat(table: MetricsTable, th: Thresholds) -> list[Finding]:
    """The return (environment runs) or the score (language-model runs) never moves: the
    last third's median within ``return_flat_rel`` of the first third's (relative to their
    size and the series' spread) and no rising trend, over at least
    ``flat_min_iterations`` iterations — the most common way a first run fails. Not when
    the updates move the policy a lot (``kl-high``, ``kl-rising-return-flat`` say that),
    when the curve rose within its first third and sits at its best (a task solved early),
    nor when the held-out evaluations rose (:func:`ppokit.diagnose.context.held_out`: a
    short run's training score is mostly sampling noise)."""
    name = return_metric(table)
    if name is None:
        return []
    pos, ret = table.series(name, active_only=True)
    if len(ret) < max(th.min_iterations, th.flat_min_iterations):
        return []
    _, kl = table.series("approx_kl", active_only=True)
    if (len(kl) and float(np.median(kl)) > th.kl_high_median) \
            or rule_kl_rising_return_flat(table, th):
        return []  # the policy moves, and goes nowhere: kl-high / kl-rising-return-flat
    corr = spearman(pos, ret)
    r1, _, r3 = thirds(ret)
    iqr = float(np.subtract(*np.quantile(ret, [0.75, 0.25])))
    scale = max(abs(r1), abs(r3), iqr, 1e-8)
    if not (abs(r3 - r1) / scale < th.return_flat_rel and abs(corr) < th.return_flat_corr):
        return []  # it moved, or it trends (up: learning slowly; down: another finding)
    if at_ceiling(ret):
        return []  # it rose early and sits at its best: solved, not flat
    held = held_out(table)
    if held.improved:
        return []
    code = "reward-flat" if name == "score_mean" else "return-flat"
    ev = [evidence(table, name, pos, ret, first_third=r1, last_third=r3, spearman=corr),
          *held.evidence]
    share = budget_share(table)
    # a short run whose score still varies and whose policy moves may not have learned
    # yet; a score that is the same number every iteration (a reward that never pays) or
    # a policy that does not move (approx_kl below clipfrac-zero's level) is judged
    # whatever the budget
    moving = not len(kl) or float(np.median(kl)) >= th.clipfrac_zero_kl
    if share is not None and share[0] < SHORT_BUDGET and np.ptp(ret) > 0 and moving:
        return [Finding(code, "info", (
            f"{name} has not moved yet ({r1:.4g} in the first third, {r3:.4g} in the "
            f"last), but this run trained {share[0]:.0%} of the default budget of "
            f"{share[1]}: too early to judge. If it stays flat over a full budget: "
            + _advice(run_kind(table))), ev)]
    return [Finding(code, "warning", _flat_message(table, name, r1, r3, corr, held), ev)]


def _advice(kind: str) -> str:
    """Where to look first when the return (score) of a run of ``kind`` does not move."""
    if kind == "lm":
        return ("Check the reward on a few completions by hand (does any completion earn "
                "more than another? score_std, zero_spread_frac), the generation cap "
                "(max_new_tokens: are answers cut before they finish?), the prompts' format, "
                "and the learning rate (too small: clipfrac stays 0).")
    if kind == "agent":
        return ("Check that the environment's reward can change with what the model does "
                "(episode/solved_frac), that the turns are long enough to act "
                "(max_turns, max_new_tokens; episode/truncated_frac) and that tool calls "
                "succeed (tool/failed_per_episode), then the learning rate.")
    return ("Check that the reward can change with the actions (a constant or "
            "action-independent reward teaches nothing), the observation (does it carry "
            "what the task needs?), the learning rate (too small: clipfrac and "
            "approx_kl stay near 0) and the budget (total steps) before anything else.")


def _flat_message(table: MetricsTable, name: str, r1: float, r3: float, corr: float,
                  held: HeldOut) -> str:
    kind = run_kind(table)
    what = "return" if kind == "env" else "score (reward)"
    advice = _advice(kind)
    if held.improved is None:
        verdict = ("Nothing was learned (no held-out evaluation to say otherwise: "
                   + ("--eval-every N logs one" if kind != "env" else "--set eval_every=N logs one")
                   + ").")
    else:
        verdict = (f"The held-out evaluations did not rise either ({held.text}): nothing "
                   "was learned.")
    return (f"The {what} never moves: {name} has a median of {r1:.4g} in the first third of "
            f"the run and {r3:.4g} in the last, with no trend (Spearman {corr:.2f}). "
            f"{verdict} {advice}")


def _running_median(y: np.ndarray, k: int = 5) -> np.ndarray:
    h = k // 2
    return np.asarray([np.median(y[max(0, i - h):i + h + 1]) for i in range(len(y))])


def rule_return_collapse(table: MetricsTable, th: Thresholds) -> list[Finding]:
    """The return climbed to a plateau, then fell by ``collapse_drop`` of what it had gained
    and stayed down for the whole tail of the run (the last ``collapse_tail_frac`` of the
    points, at least ``collapse_tail_min``)."""
    name = return_metric(table)
    if name is None:
        return []
    pos, ret = table.series(name)
    n = len(ret)
    tail = max(th.collapse_tail_min, int(np.ceil(th.collapse_tail_frac * n)))
    if n < max(th.min_iterations, tail + th.collapse_plateau_min + 3):
        return []
    sm = _running_median(ret)
    start = float(np.median(ret[:3]))
    body = sm[:n - tail]
    peak = float(body.max())
    gained = peak - start
    if not gained > max(1e-8, 0.1 * abs(peak)):
        return []  # nothing learned, nothing to lose
    band = peak - th.collapse_band * gained
    # the plateau: the longest stretch of the (smoothed) curve within the band, before the tail
    best, run_start, plateau = 0, None, None
    for i, v in enumerate(body):
        if v >= band:
            run_start = i if run_start is None else run_start
            if i - run_start + 1 > best:
                best, plateau = i - run_start + 1, (run_start, i)
        else:
            run_start = None
    if plateau is None or best < th.collapse_plateau_min:
        return []
    end = float(np.median(ret[-tail:]))
    drop = (peak - end) / gained
    if not (drop >= th.collapse_drop and float(sm[-tail:].max()) < band):
        return []
    # where it went down: the last point of the curve within the band
    last_high = int(np.flatnonzero(sm >= band)[-1])
    p0, p1 = pos[plateau[0]], pos[plateau[1]]
    ev = [evidence(table, name, pos, ret, start=start, plateau=peak,
                    plateau_iterations=f"{table.labels[p0]}–{table.labels[p1]}",
                    tail_median=end, tail_points=tail, lost_fraction=drop)]
    kl_txt = ""
    kpos, kl = table.series("approx_kl")
    if len(kl):
        before = kl[(kpos >= p0) & (kpos <= p1)]
        after = kl[kpos > pos[last_high]]
        if len(before) and len(after):
            kb, ka = float(np.median(before)), float(np.median(after))
            ev.append(evidence(table, "approx_kl", kpos, kl, plateau_median=kb,
                                after_drop_median=ka))
            kl_txt = (f" approx_kl had a median of {kb:.3g} on the plateau and {ka:.3g} "
                      "after the drop.")
    share = budget_share(table)
    short = share is not None and share[0] < SHORT_BUDGET
    note = (f" This run trained {share[0]:.0%} of the default budget of {share[1]}: a "
            "return still on its way up swings widely, so read this as a note."
            if short else "")
    return [Finding(
        "return-collapse", "info" if short else "warning",
        f"{name} reached a plateau of {peak:.4g} (iterations {table.labels[p0]}–"
        f"{table.labels[p1]}), then fell after iteration {table.labels[pos[last_high]]} and "
        f"stayed down: the median over the last {tail} points is {end:.4g}, "
        f"{drop:.0%} of what had been learned lost.{kl_txt} A policy that solved the task "
        "was overwritten by later updates: the final policy is not the best one. "
        + KEEP_BEST[run_kind(table)] + " Look at approx_kl, clipfrac and the entropy around "
        "the drop, and consider a lower or annealed learning rate, fewer epochs or a "
        "target KL." + note,
        ev)]


# how each kind of run keeps the policy from before a collapse
KEEP_BEST = {
    "env": "Keep the best policy with eval_every (best/, ppokit eval --best) or "
           "stop_at_return.",
    "lm": "Log the held-out score with --eval-every N (eval/score_mean) and keep the "
          "checkpoint from before the drop (checkpoint_every; ppokit llm eval scores it).",
    "agent": "Log held-out episodes with --eval-every N (eval/episode/solved_frac) and keep "
             "the checkpoint from before the drop (checkpoint_every).",
}
