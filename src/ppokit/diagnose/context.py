"""What a run holds besides its training curve, read before any verdict on learning.

* :func:`run_kind`: ``env`` (``ppokit train``, the SB3-style API), ``lm`` (``ppokit llm
  train`` on prompts) or ``agent`` (a language model acting over turns: ``episode/...``
  and ``tool/...`` metrics). Advice names the settings of that kind only.
* :func:`held_out`: whether the held-out evaluations say the policy improved — the
  ``eval/...`` rows of ``metrics.jsonl`` (``eval_every``; an environment run logs
  ``eval_return_mean``), the run's ``eval.json`` (a language-model run's policy against
  its reference, greedy and sampled: its score, an agent run's return and solved rate;
  an environment run's deterministic return against the training return it started
  from) and whether ``best/`` exists. A training score that sits still while the
  held-out score rises is sampling noise, not a run that learned nothing.
* :func:`at_ceiling`: the return rose and then sat at the best value it ever reached
  (a task solved early): entropy that falls then is the policy settling on its answer.

What is read from the run directory (:mod:`ppokit.diagnose.sidefiles`): ``eval.json``,
two strings of ``config.json`` and whether ``best/`` exists; nothing in it is imported or
executed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .finding import evidence
from .metrics import MetricsTable, as_number

__all__ = ["HeldOut", "at_ceiling", "budget_share", "ceiling_from", "held_out", "run_kind"]

# ppokit llm train's default --iterations (LLMConfig.iterations; the report sits below the
# language-model package and does not import it: tests/test_report_signals.py holds the two
# equal)
LM_DEFAULT_ITERATIONS = 400
# a run that trained less than this share of its default budget is too short for a
# verdict that nothing was learned
SHORT_BUDGET = 0.25

# the held-out series, by run kind, in the order they are read
HELD_OUT_SERIES = {
    "lm": ("eval/score_mean",),
    "agent": ("eval/episode/return_mean", "eval/episode/solved_frac"),
    "env": ("eval_return_mean",),
}
# what eval.json holds of the policy against its reference (``reference_`` + the key),
# by run kind (``ppokit llm eval``: src/ppokit/llm/evaluation/evaluate.py, agent_eval.py)
EVAL_JSON_KEYS = {
    "lm": ("greedy_score_mean", "score_mean"),
    "agent": ("greedy_return_mean", "return_mean", "greedy_solved_frac", "solved_frac"),
}
# a held-out change counts when it is this share of the larger end (or of the spread)
HELD_OUT_GAIN = 0.1


def run_kind(table: MetricsTable) -> str:
    """``agent``, ``lm`` or ``env`` (see the module documentation)."""
    keys = {k for r in table.records for k in r if isinstance(k, str)}
    if any(k.startswith(("episode/", "tool/")) for k in keys):
        return "agent"
    if any(k in keys for k in ("response_length_mean", "kl_ref", "score_mean")):
        return "lm"
    return "env"


@dataclass
class HeldOut:
    """The held-out verdict: ``improved`` (None: no held-out evidence), what it read
    (``text``, one clause) and the evidence records."""

    improved: bool | None = None
    text: str = ""
    evidence: list = field(default_factory=list)


def _gained(first: float, last: float, spread: float = 0.0) -> bool:
    scale = max(abs(first), abs(last), spread, 1e-8)
    return last - first > HELD_OUT_GAIN * scale


def _from_rows(table: MetricsTable, kind: str) -> HeldOut | None:
    for name in HELD_OUT_SERIES[kind]:
        pos, v = table.series(name)
        if len(v) < 2:
            continue
        spread = float(np.subtract(*np.quantile(v, [0.75, 0.25])))
        last = float(np.median(v[-max(1, len(v) // 3):]))
        ok = _gained(float(v[0]), last, spread)
        return HeldOut(ok, f"held-out {name} {v[0]:.3g} → {last:.3g}",
                       [evidence(table, name, pos, v, first=float(v[0]), end=last)])
    return None


def _from_eval_json(table: MetricsTable, kind: str) -> HeldOut | None:
    ev = table.side.get("eval") or {}
    pairs = []
    if kind in ("lm", "agent"):
        for pol in EVAL_JSON_KEYS[kind]:
            a, b = as_number(ev.get("reference_" + pol)), as_number(ev.get(pol))
            if a is not None and b is not None:
                pairs.append((pol, a, b))
    else:
        mean = as_number(ev.get("mean_return"))
        _, ret = table.series("episode_return_mean")
        if mean is not None and len(ret):
            pairs.append(("mean_return", float(np.median(ret[:3])), mean))
    if not pairs:
        return None
    ok = any(_gained(a, b) for _, a, b in pairs)
    what = ", ".join(f"{n} {a:.3g} → {b:.3g}" for n, a, b in pairs)
    return HeldOut(ok, f"eval.json: {what}",
                   [{"metric": "eval.json", "iterations": [], "values": [],
                     "summary": {n: b for n, _, b in pairs}}])


def held_out(table: MetricsTable) -> HeldOut:
    """Whether the held-out evaluations say the policy improved (:class:`HeldOut`); a
    gain in any source counts (the in-run curve or the final ``eval.json``)."""
    kind = run_kind(table)
    found = [h for h in (_from_rows(table, kind), _from_eval_json(table, kind)) if h]
    if not found:
        return HeldOut()
    best = next((h for h in found if h.improved), found[0])
    return HeldOut(best.improved, "; ".join(h.text for h in found),
                   [e for h in found for e in h.evidence])


def at_ceiling(values: np.ndarray, band: float = 0.05) -> bool:
    """The series rose from its start and its last third sits at the best value it ever
    reached (its median within ``band`` of the range below the maximum)."""
    v = np.asarray(values, dtype=np.float64)
    if len(v) < 3:
        return False
    start = float(np.median(v[:min(3, max(1, len(v) // 4))]))
    top = float(v.max())
    rng = top - start
    if not rng > max(1e-8, 0.1 * abs(top)):
        return False
    end = float(np.median(v[-max(1, len(v) // 3):]))
    return end >= top - band * rng


def ceiling_from(values: np.ndarray, band: float = 0.1) -> int | None:
    """Where a series that ends :func:`at_ceiling` first reached it (the first point whose
    running median of three is within ``band`` of the range below the maximum); None when
    it does not end there."""
    v = np.asarray(values, dtype=np.float64)
    if not at_ceiling(v):
        return None
    start = float(np.median(v[:min(3, max(1, len(v) // 4))]))
    top = float(v.max())
    sm = np.asarray([np.median(v[max(0, i - 1):i + 2]) for i in range(len(v))])
    return int(np.flatnonzero(sm >= top - band * (top - start))[0])


def budget_share(table: MetricsTable) -> tuple[float, str] | None:
    """How much of its default budget the run trained, and that budget in words: an
    environment run's last ``global_step`` against its preset's ``total_timesteps``
    (the configuration's default without a preset), a language-model run's last
    iteration against the default ``iterations``. None when the metrics do not say."""
    kind = run_kind(table)
    if kind == "env":
        from ppokit.algos.config import TrainConfig
        from ppokit.algos.presets import env_preset

        _, steps = table.series("global_step")
        env_id = table.side.get("config", {}).get("env_id") or ""
        total = env_preset(env_id).get(
            "total_timesteps", TrainConfig.__dataclass_fields__["total_timesteps"].default)
        if not len(steps):
            return None
        return float(steps.max()) / total, f"{total:,} steps"
    total = LM_DEFAULT_ITERATIONS
    done = int(table.labels.max()) if len(table) else 0
    return done / total, f"{total} iterations"
