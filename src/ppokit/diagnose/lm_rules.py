"""The report's rules for language-model runs (the token trainer's ``metrics.jsonl``).

A run is a language-model run when it logs ``response_length_mean`` or ``kl_ref``. Each rule
compares the *start* of a series (the median of its first three points, fewer for a short
held-out series) with its *end* (the median of its last third), so that a change that
happens within the first iterations and then stays — a length that explodes by iteration
15 and sits at the cap — is seen as clearly as a slow drift; single points never decide.

* ``lm-entropy-collapse``: the per-token entropy ends at a fifth of its start or less while
  the score has not improved: the policy settled on one answer per prompt without being
  paid for it (a policy that converges on *good* answers also loses entropy, but its score
  rises).
* ``length-explosion`` / ``length-collapse``: the mean response length ends at twice its
  start or more (and 4 tokens longer) / at half or less (and 2 tokens shorter).
* ``reward-hacking``: the training score rises while a measure of quality falls: the
  held-out score (``eval/score_mean``, ``eval/reward/NAME``: ``eval_every``) or one reward
  function's mean (``reward/NAME``, when several are summed).
* ``kl-ref-blowup``: the KL to the reference ends above 1 nat per token, or its last third
  is four times its middle third and still rising.
* ``zero-spread-groups``: most groups (``zero_spread_frac``) have all-equal rewards at the
  end while the score has stopped improving: no learning signal.
* ``sampler-mismatch``: ``mismatch_k3_mean`` — the mean k3 between the sampler's and the
  trainer's log-probs of the sampled tokens — ends at 1e-3 nats per token or more. The
  token trainer logs it every iteration (over the batch when it recomputes the old
  log-probs, else on a probe of a few sequences): about 1e-13 when both sides run float32,
  1e-5–1e-4 on the built-in model with a bfloat16 sampler (``sampler_precision``).

A GSPO run's ``clipfrac_sequence`` (sequences, with a clip range of a few 1e-4) and a
CISPO run's ``clipfrac_weight`` (weights capped, no gradient lost) are not the token
clip fraction and are not judged by ``clipfrac-high``.

Clipping saturation (``clipfrac-high``, with a lower threshold for language models) and the
truncated share (``truncation-high``) are in :mod:`ppokit.diagnose.rules`.
"""

from __future__ import annotations

import numpy as np

from .context import held_out
from .finding import Finding, evidence
from .metrics import MetricsTable
from .thresholds import Thresholds
from .trend import spearman, thirds

__all__ = ["is_lm_run", "start_end", "LM_RULES"]


def is_lm_run(table: MetricsTable) -> bool:
    return table.has("response_length_mean") or table.has("kl_ref")


def start_end(values: np.ndarray) -> tuple[float, float]:
    """Median of the first three points (of the first quarter when there are fewer than
    12) and of the last third."""
    v = np.asarray(values, dtype=np.float64)
    n = len(v)
    k0 = min(3, max(1, n // 4))
    k1 = max(1, n // 3)
    return float(np.median(v[:k0])), float(np.median(v[n - k1:]))


def _scale(values: np.ndarray, *ends: float) -> float:
    """A change's yardstick: the larger end, or the series' interquartile range."""
    iqr = float(np.subtract(*np.quantile(values, [0.75, 0.25])))
    return max(max(abs(e) for e in ends), iqr, 1e-8)


def _score_improved(table: MetricsTable, th: Thresholds) -> tuple[bool, dict | None]:
    """Whether ``score_mean`` ends above where it started by ``lm_score_gain`` of its
    scale, and its evidence (None when it is not logged). Where it started: the higher of
    its first value (the starting policy's, before any update) and its start median, so
    that a run that first crashes and then recovers part of the way has not improved."""
    pos, sc = table.series("score_mean")
    if len(sc) < th.min_iterations:
        return False, None
    s0, s1 = start_end(sc)
    s0 = max(s0, float(sc[0]))
    gained = s1 - s0 > th.lm_score_gain * _scale(sc, s0, s1)
    return gained, evidence(table, "score_mean", pos, sc, start=s0, end=s1)


def _end_median(table: MetricsTable, name: str) -> tuple[float | None, dict | None]:
    pos, v = table.series(name)
    if len(v) == 0:
        return None, None
    end = start_end(v)[1]
    return end, evidence(table, name, pos, v, end=end)


def rule_lm_entropy_collapse(table: MetricsTable, th: Thresholds) -> list[Finding]:
    if not is_lm_run(table):
        return []
    pos, h = table.series("entropy")
    if len(h) < th.min_iterations or float(h.min()) < -1e-6:
        return []
    h0, h1 = start_end(h)
    if not (h0 > 1e-6 and h1 <= th.lm_entropy_floor * h0):
        return []
    improved, score_ev = _score_improved(table, th)
    if improved or held_out(table).improved:
        return []  # converging on answers that pay
    ev = [evidence(table, "entropy", pos, h, start=h0, end=h1)]
    ev += [score_ev] if score_ev else []
    z, z_ev = _end_median(table, "zero_spread_frac")
    ev += [z_ev] if z_ev else []
    score_txt = ("" if score_ev is None else
                 f", while score_mean went from {score_ev['summary']['start']:.3g} to "
                 f"{score_ev['summary']['end']:.3g}")
    z_txt = "" if z is None else (f"; {z:.0%} of the groups end with all-equal rewards, so "
                                  "they teach nothing")
    return [Finding(
        "lm-entropy-collapse", "warning",
        f"The per-token entropy collapsed from {h0:.3g} to {h1:.3g} nats{score_txt}{z_txt}: "
        "the policy now writes (nearly) one answer per prompt without being paid more for "
        "it, and exploration is over. Lower the learning rate or n_epochs, add an entropy "
        "bonus (ent_coef), keep the sampling temperature at 1, and look at the KL per update "
        "(approx_kl) around the fall.", ev)]


def _length_change(table: MetricsTable, th: Thresholds):
    if not table.has("response_length_mean"):
        return None
    pos, ln = table.series("response_length_mean")
    if len(ln) < th.min_iterations:
        return None
    l0, l1 = start_end(ln)
    return pos, ln, l0, l1


def rule_length_explosion(table: MetricsTable, th: Thresholds) -> list[Finding]:
    got = _length_change(table, th)
    if got is None:
        return []
    pos, ln, l0, l1 = got
    if not (l1 >= th.length_explosion_factor * l0 and l1 - l0 >= th.length_explosion_min):
        return []
    ev = [evidence(table, "response_length_mean", pos, ln, start=l0, end=l1)]
    t, t_ev = _end_median(table, "truncated_frac")
    ev += [t_ev] if t_ev else []
    cap = "" if not t else f"; {t:.0%} of the responses end cut at the length limit"
    return [Finding(
        "length-explosion", "warning",
        f"Responses grew from {l0:.3g} to {l1:.3g} tokens ({l1 / max(l0, 1e-8):.1f}×){cap}. "
        "Unless the task needs longer answers (then the held-out score rises with them), "
        "the policy is buying reward with length: check whether a reward grows with the "
        "number of tokens (a reward model trained on pairs that prefer longer answers, a "
        "format bonus per line), how cut responses are scored (truncation = none scores "
        "them like finished ones; penalty or mask do not), and the loss aggregation: the "
        "mean of per-sequence token means (GRPO's) weighs each token of a long answer less, "
        "so long wrong answers are punished less (dr-grpo's seq-mean-token-sum-norm does "
        "not).", ev)]


def rule_length_collapse(table: MetricsTable, th: Thresholds) -> list[Finding]:
    got = _length_change(table, th)
    if got is None:
        return []
    pos, ln, l0, l1 = got
    if not (l1 <= th.length_collapse_factor * l0 and l0 - l1 >= th.length_collapse_min):
        return []
    return [Finding(
        "length-collapse", "warning",
        f"Responses shrank from {l0:.3g} to {l1:.3g} tokens: the policy learned that "
        "stopping early pays. Look for a cost that grows with length: a reward that falls "
        "per token, a truncation penalty larger than the rewards' spread, a per-token KL "
        "reward (kl_mode = reward: each token pays β·KL, so shorter is cheaper), or scores "
        "that are mostly negative (a short answer loses least); the samples in "
        "samples.jsonl show what the short answers are.",
        [evidence(table, "response_length_mean", pos, ln, start=l0, end=l1)])]


def _quality_series(table: MetricsTable) -> list[str]:
    """Held-out scores and, when several reward functions are summed, each one's mean."""
    names = sorted({k for r in table.records for k in r if isinstance(k, str)})
    held = [n for n in names if n == "eval/score_mean"
            or (n.startswith("eval/reward/") and not n.endswith("_std"))]
    parts = [n for n in names if n.startswith("reward/") and not n.endswith("_std")]
    return held + (parts if len(parts) > 1 else [])


def rule_reward_hacking(table: MetricsTable, th: Thresholds) -> list[Finding]:
    if not is_lm_run(table):
        return []
    spos, sc = table.series("score_mean")
    if len(sc) < th.min_iterations:
        return []
    s0, s1 = start_end(sc)
    if not s1 - s0 >= th.hacking_rise * _scale(sc, s0, s1):
        return []
    falling = []
    for name in _quality_series(table):
        pos, q = table.series(name)
        if len(q) < 3:
            continue
        q0, q1 = start_end(q)
        if q0 - q1 >= th.hacking_drop * _scale(q, q0, q1):
            falling.append((name, pos, q, q0, q1))
    if not falling:
        return []
    ev = [evidence(table, "score_mean", spos, sc, start=s0, end=s1)]
    ev += [evidence(table, n, p, q, start=a, end=b) for n, p, q, a, b in falling]
    what = "; ".join(f"{n} {a:.3g} → {b:.3g}" for n, _, _, a, b in falling)
    held = any(n.startswith("eval/") for n, *_ in falling)
    return [Finding(
        "reward-hacking", "warning",
        f"The training reward rose (score_mean {s0:.3g} → {s1:.3g}) while "
        + ("the held-out score fell" if held else "one of the summed rewards fell")
        + f" ({what}): the policy is being paid for something other than what those "
        "measure — an exploit of the reward (length, format, a loophole of the reward "
        "model), or prompts it has learned by heart. Read samples.jsonl for what the "
        "high-reward answers look like, fix or reweigh the reward, and keep the best "
        "held-out policy rather than the last; a larger kl_coef slows the drift but does "
        "not repair the reward.", ev)]


def _kl_per_token(table: MetricsTable) -> tuple[np.ndarray, np.ndarray]:
    if table.has("kl_ref_token"):
        return table.series("kl_ref_token")
    kl, ln = table.column("kl_ref"), table.column("response_length_mean")
    per = kl / np.where(ln > 0, ln, np.nan)
    pos = np.flatnonzero(np.isfinite(per))
    return pos, per[pos]


def rule_kl_ref_blowup(table: MetricsTable, th: Thresholds) -> list[Finding]:
    kpos, kl = table.series("kl_ref")
    if len(kl) < th.min_iterations:
        return []
    tpos, kt = _kl_per_token(table)
    level = start_end(kt)[1] if len(kt) >= th.min_iterations else 0.0
    _, k2, k3 = thirds(kl)
    half = len(kl) // 2
    rising = spearman(kpos[half:], kl[half:]) >= 0.5
    accel = (k3 >= th.kl_accel_factor * max(k2, 1e-12) and k3 >= th.kl_accel_floor
             and rising)
    if not (level >= th.kl_token_high or accel):
        return []
    ev = [evidence(table, "kl_ref", kpos, kl, middle_third=k2, last_third=k3,
                    rising_last_half=bool(rising))]
    if len(kt):
        ev.append(evidence(table, "kl_ref_token", tpos, kt, end=level))
    # the KL coefficient: kl_coef (runs before the one vocabulary logged it as beta)
    beta, b_ev = _end_median(table, "kl_coef" if table.has("kl_coef") else "beta")
    ev += [b_ev] if b_ev else []
    why = (f"it ends at {level:.3g} nats per token" if level >= th.kl_token_high else
           f"its last third ({k3:.3g} nats per sequence) is {k3 / max(k2, 1e-12):.1f}× its "
           "middle third and still rising")
    beta_txt = "" if beta is None else f" (β = {beta:.3g})"
    return [Finding(
        "kl-ref-blowup", "warning",
        f"The KL to the reference blows up: {why}. The policy has left the region where the "
        f"reference (and any reward model trained on its outputs) is trustworthy{beta_txt}. "
        "Raise kl_coef or set kl_target (adaptive β), lower the learning rate, and read the "
        "samples for what the reward pays.", ev)]


def _ends_at_least(table: MetricsTable, name: str, limit: float, th: Thresholds):
    """``(positions, values, end)`` of ``name`` when its end reaches ``limit``, else
    None (also when it is logged in fewer than ``min_iterations`` iterations)."""
    pos, v = table.series(name)
    if len(v) < th.min_iterations:
        return None
    end = start_end(v)[1]
    return (pos, v, end) if end >= limit else None


def rule_zero_spread_groups(table: MetricsTable, th: Thresholds) -> list[Finding]:
    got = _ends_at_least(table, "zero_spread_frac", th.zero_spread_median, th)
    if got is None:
        return []
    pos, z, z1 = got
    spos, sc = table.series("score_mean")
    half = len(sc) // 2
    if len(sc) >= th.min_iterations and spearman(spos[half:], sc[half:]) >= 0.3:
        return []  # still learning from the groups that do differ
    ev = [evidence(table, "zero_spread_frac", pos, z, end=z1)]
    if len(sc):
        ev.append(evidence(table, "score_mean", spos, sc, end=start_end(sc)[1]))
    return [Finding(
        "zero-spread-groups", "warning",
        f"{z1:.0%} of the groups end with all their completions scored alike, and the "
        "score has stopped improving: a group estimator gives those groups advantage 0, so "
        "most of each batch teaches nothing. If every answer is already right, the prompts "
        "are too easy (harder ones, or stop); otherwise the reward cannot tell the "
        "completions apart: give partial credit, raise samples_per_prompt, or leave out "
        "prompts whose groups are uniform.", ev)]


def rule_sampler_mismatch(table: MetricsTable, th: Thresholds) -> list[Finding]:
    got = _ends_at_least(table, "mismatch_k3_mean", th.mismatch_k3, th)
    if got is None:
        return []
    pos, m, m1 = got
    return [Finding(
        "sampler-mismatch", "warning",
        f"The sampler's and the trainer's log-probs of the same tokens disagree: mean k3 "
        f"{m1:.3g} nats per token over the last third (alone worth |ρ−1| ≈ "
        f"{np.sqrt(2 * m1):.2f} before any update), so the update's ratios are partly "
        "off-policy and the clip is spent on numerics. Look for a different number format "
        "or kernels on the two sides (a bfloat16 inference engine against a float32 "
        "trainer), a temperature applied on one side only, or stale weights in the sampler; "
        "old_logprobs = recompute makes the ratios start at exactly 1, and rollout_is = "
        "truncate (or mask) reweighs the tokens for the sampler they came from.",
        [evidence(table, "mismatch_k3_mean", pos, m, end=m1)])]


LM_RULES = {
    "lm-entropy-collapse": (rule_lm_entropy_collapse, "LM: entropy collapses while the "
                            "score does not improve"),
    "length-explosion": (rule_length_explosion, "LM: responses grow to twice their length"),
    "length-collapse": (rule_length_collapse, "LM: responses shrink to half their length"),
    "reward-hacking": (rule_reward_hacking, "LM: training reward up, held-out score (or a "
                       "summed reward) down"),
    "kl-ref-blowup": (rule_kl_ref_blowup, "LM: KL to the reference blows up"),
    "zero-spread-groups": (rule_zero_spread_groups, "LM: most groups have all-equal "
                           "rewards, score flat"),
    "sampler-mismatch": (rule_sampler_mismatch, "LM: sampler and trainer log-probs "
                         "disagree (mismatch_k3_mean)"),
}
