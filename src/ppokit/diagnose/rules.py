"""The report's rules: each reads several metrics together and names one pattern.

Every rule works on windows, never on single points: medians over thirds of the run or over
its non-annealed part, and rank correlation with time. Iterations where the learning rate or
the clip range has been annealed below a quarter of its peak are left out of the rules about
how far the policy moves per update (a linear schedule legitimately ends with clip fractions
and KL near zero).

Codes are stable; thresholds live in :class:`Thresholds` so a user can tune them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .agent_rules import AGENT_RULES
from .context import ceiling_from
from .finding import MAX_POINTS, Finding, evidence, round_figure
from .finding import iteration_numbers as _its
from .lm_rules import LM_RULES, is_lm_run
from .metrics import MetricsTable, as_number
from .return_rules import (
    return_metric,
    rule_kl_rising_return_flat,
    rule_return_collapse,
    rule_return_flat,
    rule_reward_flat,
)
from .thresholds import Thresholds
from .trend import rel_change, spearman, thirds

__all__ = ["Finding", "Thresholds", "RULES", "CODES", "SEVERITIES", "diagnose"]

SEVERITIES = ("error", "warning", "info")


Rule = Callable[[MetricsTable, Thresholds], list[Finding]]


def rule_nonfinite(table: MetricsTable, th: Thresholds) -> list[Finding]:
    names = sorted({k for r in table.records for k in r})
    bad = {n: table.nonfinite(n) for n in names}
    bad = {n: idx for n, idx in bad.items() if len(idx)}
    if not bad:
        return []
    ev = [{"metric": n, "iterations": [int(table.labels[i]) for i in idx[:MAX_POINTS]],
           "values": [str(table.records[i][n]) for i in idx[:MAX_POINTS]],
           "summary": {"count": len(idx)}} for n, idx in bad.items()]
    first = min(int(idx[0]) for idx in bad.values())
    return [Finding(
        "metrics-nonfinite", "error",
        f"{', '.join(bad)} became NaN or infinite (first at iteration {table.labels[first]}). "
        "Training has diverged numerically: look for a learning rate far too large, rewards or "
        "observations on a huge scale, a log of zero probability, or a division by a zero std.",
        ev)]


def clip_free(table: MetricsTable) -> bool:
    """The algorithm has no clip (A2C, REINFORCE, PPO with a KL penalty): the trainer logs
    ``clip_range`` as null every iteration, and its clip fraction is 0 by construction."""
    return any("clip_range" in r for r in table.records) and not table.has("clip_range")


def rule_clipfrac_zero(table: MetricsTable, th: Thresholds) -> list[Finding]:
    pos, cf = table.series("clipfrac", active_only=True)
    if len(cf) < th.min_iterations or clip_free(table):
        return []
    med, q90 = float(np.median(cf)), float(np.quantile(cf, 0.9))
    if not (med < th.clipfrac_zero_median and q90 < th.clipfrac_zero_q90):
        return []
    _, kl_all = table.series("approx_kl", active_only=True)
    if len(kl_all) and float(np.median(kl_all)) >= th.clipfrac_zero_kl:
        return []  # the policy does move each update: a small clip fraction is no stall
    collapse = _entropy_collapse(table, th)
    if collapse is not None and solved(table, int(collapse.pos[collapse.k])):
        return []  # settled on its best answer: a deterministic policy has nothing to move
    cause = "collapsed-policy" if collapse is not None else "small-steps"
    ev = [evidence(table, "clipfrac", pos, cf, median=med, q90=q90, cause=cause)]
    kpos, kl = table.series("approx_kl", active_only=True)
    if len(kl):
        ev.append(evidence(table, "approx_kl", kpos, kl, median=float(np.median(kl))))
    head = (f"The clip fraction stays near 0 (median {med:.4f} over iterations "
            f"{_its(table, pos)}, not counting an annealed tail)")
    if collapse is not None:
        at = int(collapse.pos[collapse.k])
        ev.append(evidence(table, "entropy", collapse.pos, collapse.values,
                            start=collapse.start, after_median=collapse.after))
        peak = _kl_peak_before(table, at)
        peak_txt = "" if peak is None else (
            f" approx_kl peaked at {peak[1]:.3g} at iteration {table.labels[peak[0]]}, just "
            "before.")
        msg = (head + f", but because the policy has collapsed: its entropy fell from "
               f"{collapse.start:.3g} to {collapse.after:.3g} by iteration "
               f"{table.labels[at]}, so the chosen actions already have probability ≈ 1 and "
               "no ratio can move. This is the aftermath of steps that were too large, not "
               f"too small.{peak_txt} Lower the learning rate or the number of epochs, or "
               "set a target KL, and restart from before the collapse.")
    else:
        msg = (head + ": updates hardly move the policy off its rollout version, so the "
               "clip never engages. Usual causes are a learning rate that is too small, too "
               "few epochs or weak advantages; it can also mean the policy has settled. Read "
               "it with approx_kl and the return curve before raising the learning rate or "
               "the number of epochs.")
    return [Finding("clipfrac-zero", "warning", msg, ev)]


def rule_clipfrac_high(table: MetricsTable, th: Thresholds) -> list[Finding]:
    pos, cf = table.series("clipfrac", active_only=True)
    if len(cf) < th.min_iterations:
        return []
    med = float(np.median(cf))
    lm = is_lm_run(table)
    if not med > (th.clipfrac_high_median_lm if lm else th.clipfrac_high_median):
        return []
    ev = [evidence(table, "clipfrac", pos, cf, median=med)]
    apos, act = table.series("clip_active_frac", active_only=True)
    if len(act):
        ev.append(evidence(table, "clip_active_frac", apos, act,
                            median=float(np.median(act))))
    if lm:
        msg = (f"Clipping is saturated: a median {med:.0%} of the action tokens' ratios "
               f"leave the clip range during an update (iterations {_its(table, pos)}), "
               "and the clipped ones (clip_active_frac) contribute no gradient, so the "
               "update learns from a shrinking, biased share of the tokens. Lower the "
               "learning rate or n_epochs (or use more, smaller minibatches), or set "
               "target_kl; if it is high from the first iteration, look at the old "
               "log-probs (a sampler that disagrees with the trainer, see "
               "sampler-mismatch).")
    else:
        msg = (f"The clip fraction stays high (median {med:.3f} over iterations "
               f"{_its(table, pos)}): during each update most sampled ratios leave the "
               "clip range, so the new policy is far from the one that collected the data. "
               "Compare clip_active_frac (samples whose gradient really is cut) and "
               "approx_kl; lower the learning rate or the number of epochs, or add a "
               "target KL.")
    return [Finding("clipfrac-high", "warning", msg, ev)]


def rule_kl_high(table: MetricsTable, th: Thresholds) -> list[Finding]:
    pos, kl = table.series("approx_kl", active_only=True)
    if len(kl) < th.min_iterations:
        return []
    med = float(np.median(kl))
    if not med > th.kl_high_median:
        return []
    ev = [evidence(table, "approx_kl", pos, kl, median=med)]
    cpos, cf = table.series("clipfrac", active_only=True)
    if len(cf):
        ev.append(evidence(table, "clipfrac", cpos, cf, median=float(np.median(cf))))
    return [Finding(
        "kl-high", "warning",
        f"approx_kl (old → new policy, per update) stays large (median {med:.3g} over "
        f"iterations {_its(table, pos)}, above {th.kl_high_median:g}, the level at which a "
        "typical target KL of 0.01 would stop the update): each update moves the policy far "
        "from the data it was computed on, and the clip alone does not prevent that. Lower "
        "the learning rate or the number of epochs, or set a target KL; read it with "
        "clipfrac and the return curve.",
        ev)]


def _early_stop(rec: dict) -> tuple[bool, bool, float | None]:
    """``(logged, fired, epoch)`` of one record: an ``early_stop`` object
    (``{"epoch": .., "minibatch": ..}`` or null), ``early_stop_epoch`` (null when it did not
    fire) or an ``early_stopped`` flag."""
    if "early_stop" in rec:
        es = rec["early_stop"]
        fired = es not in (None, False, {}, [])
        ep = es.get("epoch") if isinstance(es, dict) else None
    elif "early_stop_epoch" in rec:
        ep = rec["early_stop_epoch"]
        fired = ep is not None
    elif "early_stopped" in rec:  # the token-level trainer logs a flag
        ep, fired = None, bool(rec["early_stopped"])
    else:
        return False, False, None
    return True, fired, as_number(ep)


def rule_early_stop_frequent(table: MetricsTable, th: Thresholds) -> list[Finding]:
    info = [_early_stop(r) for r in table.records]
    logged = [i for i, (lg, _, _) in enumerate(info) if lg]
    if len(logged) < th.min_iterations:
        return []
    fired = [i for i in logged if info[i][1]]
    frac = len(fired) / len(logged)
    if not frac > th.early_stop_frac:
        return []
    epochs = [np.nan if info[i][2] is None else info[i][2] for i in fired]
    ev = evidence(table, "early_stop.epoch", np.asarray(fired), np.asarray(epochs),
                   fired=len(fired), iterations_logged=len(logged), fraction=frac)
    ep_ok = [e for e in epochs if np.isfinite(e)]
    # epochs are counted from 0 in the metrics; say it the human way
    where = f", typically during epoch {np.median(ep_ok) + 1:.0f}" if ep_ok else ""
    return [Finding(
        "early-stop-frequent", "warning",
        f"Target-KL early stopping fired in {len(fired)} of {len(logged)} iterations{where}: "
        "the configured epochs are mostly not being run, and the KL check is doing the job "
        "of the step size. Lower the learning rate or the number of epochs so that early stop "
        "is a guard that rarely fires (it is not a hard trust region either).",
        [ev])]


def rule_critic_mean_only(table: MetricsTable, th: Thresholds) -> list[Finding]:
    epos, ev = table.series("explained_variance")
    vpos, vl = table.series("value_loss")
    if len(ev) < th.min_iterations or len(vl) < th.min_iterations:
        return []
    ev_med = float(np.median(ev))
    # q90: a critic that explained the returns well for a while (then saw near-constant
    # returns, where explained variance is noise) is not "mean only"
    ev_q90 = float(np.quantile(ev, 0.9))
    if not (abs(ev_med) < th.ev_near_zero and ev_q90 < th.ev_q90_max):
        return []
    v_corr = spearman(vpos, vl)
    v1, _, v3 = thirds(vl)
    if not (v_corr <= th.value_fall_corr and v3 <= th.value_fall_factor * v1):
        return []
    return [Finding(
        "critic-mean-only", "warning",
        f"The value loss falls ({v1:.4g} → {v3:.4g}) but explained variance stays near 0 "
        f"(median {ev_med:.3f}): the critic seems to have learned only the average return, "
        "not how it varies between states, so the advantage baseline is weak. Look at the "
        "advantages' mean, spread and correlation with returns; consider tuning the critic "
        "separately (its learning rate or epochs, or a separate network).",
        [evidence(table, "explained_variance", epos, ev, median=ev_med, q90=ev_q90),
         evidence(table, "value_loss", vpos, vl, first_third=v1, last_third=v3,
                   spearman=v_corr)])]


def rule_value_loss_divergence(table: MetricsTable, th: Thresholds) -> list[Finding]:
    """The critic's loss on a scale no network fits (its last third's median above
    ``value_loss_huge``: returns of thousands per step, unnormalised), or growing tenfold
    over the run while explained variance stays near 0."""
    vpos, vl = table.series("value_loss")
    if len(vl) < th.min_iterations:
        return []
    v1, _, v3 = thirds(vl)
    _, ev = table.series("explained_variance")
    ev_med = float(np.median(ev)) if len(ev) else 0.0
    rising = (spearman(vpos, vl) >= th.kl_rise_corr and v3 >= th.value_rise_factor
              * max(v1, 1e-12) and ev_med < th.ev_near_zero)
    if not (v3 >= th.value_loss_huge or rising):
        return []
    why = (f"its median over the last third is {v3:.3g}" if v3 >= th.value_loss_huge else
           f"it grew from {v1:.3g} to {v3:.3g} over the run")
    return [Finding(
        "value-loss-divergence", "warning",
        f"The value loss diverges: {why}, while explained variance has a median of "
        f"{ev_med:.2f}. The critic cannot follow returns on this scale, its gradient "
        "swamps the policy's (one optimiser, one max_grad_norm) and the advantages are "
        "noise. " + ("Normalise or clip the scores (score_norm, score_clip) or scale the "
                     "reward, and check vf_coef and critic_lr." if is_lm_run(table) else
                     "Normalise the rewards (normalize_reward = true) or scale them, and "
                     "check vf_coef and the learning rate."),
        [evidence(table, "value_loss", vpos, vl, first_third=v1, last_third=v3)])]


@dataclass
class _Collapse:
    pos: np.ndarray       # record positions of the entropy series
    values: np.ndarray
    start: float          # entropy at the start (median of the first 3)
    k: int                # index into pos/values where it fell below the floor
    after: float          # median entropy from there on


def _entropy_collapse(table: MetricsTable, th: Thresholds) -> _Collapse | None:
    """Where entropy fell below ``entropy_collapse_frac`` of its start within the first
    ``entropy_collapse_within`` of the run and stayed there (None when it did not). A
    language model's entropy is judged with its score (``lm-entropy-collapse``)."""
    if is_lm_run(table):
        return None
    pos, h = table.series("entropy")
    n = len(h)
    if n < th.min_iterations or float(h.min()) < -1e-6:
        return None  # differential entropy (continuous actions) has no natural zero
    h0 = float(np.median(h[:3]))
    if not h0 > 1e-6:
        return None
    # smoothed (running median of 3) so one dip does not count
    sm = np.asarray([np.median(h[max(0, i - 1):i + 2]) for i in range(n)])
    low = np.flatnonzero(sm < th.entropy_collapse_frac * h0)
    if len(low) == 0:
        return None
    k = int(low[0])
    if k > th.entropy_collapse_within * (n - 1):
        return None
    after = float(np.median(h[k:]))
    if not after < 1.5 * th.entropy_collapse_frac * h0:
        return None
    return _Collapse(pos, h, h0, k, after)


def _kl_peak_before(table: MetricsTable, last_pos: int) -> tuple[int, float] | None:
    """(position, value) of the largest approx_kl up to record ``last_pos`` (supporting
    evidence only: a rule never fires on it)."""
    kpos, kl = table.series("approx_kl")
    keep = kpos <= last_pos
    if not keep.any():
        return None
    i = int(np.argmax(kl[keep]))
    return int(kpos[keep][i]), float(kl[keep][i])


def solved(table: MetricsTable, by: int | None = None) -> bool:
    """The return rose and its last third sits at the best value it reached — a task
    solved, where a deterministic policy is the goal (:func:`context.ceiling_from`) —
    and (with ``by``, a record position) it had reached that level by then."""
    name = return_metric(table)
    if name is None:
        return False
    pos, ret = table.series(name)
    at = ceiling_from(ret)
    return at is not None and (by is None or int(pos[at]) <= by)


def rule_entropy_collapse(table: MetricsTable, th: Thresholds) -> list[Finding]:
    c = _entropy_collapse(table, th)
    if c is None or solved(table, int(c.pos[c.k])):
        return []  # settling once the task is solved is the goal, not a collapse
    at = int(c.pos[c.k])
    peak = _kl_peak_before(table, at)
    ev = [evidence(table, "entropy", c.pos, c.values, start=c.start,
                    collapsed_at=int(table.labels[at]), after_median=c.after)]
    peak_txt = ""
    if peak is not None:
        ev.append({"metric": "approx_kl", "iterations": [int(table.labels[peak[0]])],
                   "values": [round_figure(peak[1])], "summary": {"peak_before_collapse": True}})
        peak_txt = (f" Before it, approx_kl peaked at {peak[1]:.3g} (iteration "
                    f"{table.labels[peak[0]]}); a large value there points to updates that "
                    "were too big.")
    return [Finding(
        "entropy-collapse", "warning",
        f"Policy entropy collapses early: from {c.start:.3g} to below "
        f"{th.entropy_collapse_frac:.0%} of it by iteration {table.labels[at]} "
        f"(of {len(c.values)}), and stays there (median {c.after:.3g}). The policy has become "
        "nearly deterministic before it has had time to explore; a small mean KL can hide a "
        "distribution that has collapsed onto a few actions." + peak_txt + " Check the "
        "learning rate and epochs, consider an entropy bonus, and look at the per-state "
        "(per-token) spread, not just the mean.",
        ev)]


def rule_length_reward_coupling(table: MetricsTable, th: Thresholds) -> list[Finding]:
    if not table.has("response_length_mean"):
        return []
    score = "score_mean" if table.has("score_mean") else None
    if score is None:
        return []
    lpos, length = table.series("response_length_mean")
    spos, sc = table.series(score)
    if table.has("kl_ref"):
        kname = "kl_ref"
        kpos, kl = table.series("kl_ref")
        sign = 1.0
    elif table.has("non_score_reward"):
        kname = "non_score_reward"
        kpos, kl = table.series("non_score_reward")
        sign = -1.0  # the penalty grows as the non-score reward becomes more negative
    else:
        return []
    if min(len(length), len(sc), len(kl)) < th.min_iterations:
        return []
    l_corr, s_corr = spearman(lpos, length), spearman(spos, sc)
    k_corr = sign * spearman(kpos, kl)
    l1, _, l3 = thirds(length)
    if not (l_corr >= th.coupling_corr and s_corr >= th.coupling_corr
            and k_corr >= th.coupling_corr and rel_change(l1, l3, abs(l1) or 1.0)
            >= th.length_rise_rel):
        return []
    s1, _, s3 = thirds(sc)
    k1, _, k3 = thirds(kl)
    return [Finding(
        "length-reward-coupling", "warning",
        f"Reward, KL to the reference and response length rise together (length {l1:.3g} → "
        f"{l3:.3g}, {score} {s1:.3g} → {s3:.3g}, {kname} {k1:.3g} → {k3:.3g}): the policy may "
        "be buying score with drift and longer answers, a sign that the reward prefers length "
        "or a format. First evaluate the score sliced by response length and prompt type, "
        "then check the end-of-sequence reward and how truncations are scored; only then tune "
        "the KL coefficient, since raising it alone hides a biased reward rather than fixing it.",
        [evidence(table, "response_length_mean", lpos, length, first_third=l1,
                   last_third=l3, spearman=l_corr),
         evidence(table, score, spos, sc, first_third=s1, last_third=s3, spearman=s_corr),
         evidence(table, kname, kpos, kl, first_third=k1, last_third=k3,
                   spearman=sign * k_corr)])]


def rule_truncation_high(table: MetricsTable, th: Thresholds) -> list[Finding]:
    pos, tr = table.series("truncated_frac")
    if len(tr) < th.min_iterations:
        return []
    k = max(1, len(tr) // 3)
    last = float(np.median(tr[-k:]))
    if not last > th.truncation_median:
        return []
    return [Finding(
        "truncation-high", "warning",
        f"{last:.0%} of responses hit the length limit (median over the last third, "
        f"iterations {_its(table, pos[-k:])}): many sequences end by truncation, not by an "
        "end-of-sequence token, so their final score and the credit it assigns are "
        "questionable. Check the maximum number of new tokens, whether the reward favours "
        "length, and how truncated responses are treated (bootstrap, penalty or masking).",
        [evidence(table, "truncated_frac", pos, tr, last_third_median=last)])]


RULES: dict[str, tuple[Rule, str]] = {
    "metrics-nonfinite": (rule_nonfinite, "a logged metric is NaN or infinite"),
    "clipfrac-zero": (rule_clipfrac_zero, "clip fraction stuck near 0"),
    "clipfrac-high": (rule_clipfrac_high, "clip fraction stuck high"),
    "kl-high": (rule_kl_high, "approx KL per update stays large"),
    "kl-rising-return-flat": (rule_kl_rising_return_flat, "approx KL rises, return flat"),
    "return-flat": (rule_return_flat, "the return never moves"),
    "reward-flat": (rule_reward_flat, "LM: the score never moves"),
    "early-stop-frequent": (rule_early_stop_frequent, "target-KL early stop fires most "
                            "iterations"),
    "critic-mean-only": (rule_critic_mean_only, "value loss falls, explained variance ≈ 0"),
    "value-loss-divergence": (rule_value_loss_divergence, "value loss huge or growing "
                              "tenfold, explained variance ≈ 0"),
    "entropy-collapse": (rule_entropy_collapse, "entropy collapses early"),
    "return-collapse": (rule_return_collapse, "return falls after a plateau and stays down"),
    "length-reward-coupling": (rule_length_reward_coupling, "LM: reward, KL and length rise "
                               "together"),
    "truncation-high": (rule_truncation_high, "LM: many responses truncated"),
    **LM_RULES,
    **AGENT_RULES,
}
CODES = tuple(RULES)


def diagnose(table: MetricsTable, thresholds: Thresholds | None = None) -> list[Finding]:
    """Run every rule on ``table``; findings sorted by severity, then rule order."""
    th = thresholds or Thresholds()
    out: list[Finding] = []
    for rule, _ in RULES.values():
        out.extend(rule(table, th))
    order = {s: i for i, s in enumerate(SEVERITIES)}
    return sorted(out, key=lambda f: order[f.severity])
