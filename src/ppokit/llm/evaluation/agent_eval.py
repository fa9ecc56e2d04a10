"""Held-out evaluation of an agent run (``env`` set: docs/agents.md), what ``ppokit llm
eval`` does for it.

The trained policy (the run's newest intact checkpoint) and the reference — the policy
training started from, ``reference/`` — each play one episode from every held-out seed:
``EVAL_SEED_OFFSET + k`` for ``k < n_eval_prompts``, seeds training never draws (the ones
``eval_every`` plays). Both are sampled at the training temperature (or ``temperature``)
with a generator seeded by ``seed``, the same for each, and, with ``greedy``, played
again greedily (temperature 0), as prompt runs are scored. For each: the solved rate
(episodes that terminated with a positive return), the mean return and the mean number
of model turns, each with a 95 % interval (:func:`ppokit.core.stats.mean_interval`:
Wilson's for the solved rate and for returns that are all 0 or 1, else the normal
approximation), and the gain — trained less reference — with the normal interval of the
mean of its differences paired by seed. ``eval.json`` keeps every episode's record
(``episodes``: ``trained``, ``reference``, ``greedy_trained``, ``greedy_reference``, in
the order of the seeds), from which each figure can be recomputed.

The environment is rebuilt from what the run records only where nothing is imported
because the run names it: ppokit's own environments and ids registered in this process.
An environment from ``module:Id`` and the tools are named again (``--env``, ``--tools``),
as for resuming; one given in Python is passed again (``env=``, ``tools=``).
"""

from __future__ import annotations

import contextlib
import statistics
from dataclasses import replace

import torch

from ppokit.core.stats import mean_interval
from ppokit.errors import UsageError

__all__ = ["evaluate_agent_run", "agent_eval_lines", "ci_key", "gain_key", "summary",
           "METRICS"]

# (eval.json key, the episode record's field, mean_interval's ``binary``)
METRICS = (("solved_frac", "solved", None), ("return_mean", "return", None),
           ("turns_mean", "turns", False))
BATCH = 128  # episodes played at once
N_SAMPLES = 8  # episodes of the trained policy kept as text


def ci_key(key: str) -> str:
    """The key of ``key``'s 95 % interval (``score_mean`` → ``score_ci95``,
    ``solved_frac`` → ``solved_frac_ci95``)."""
    return key.removesuffix("_mean") + "_ci95"


def gain_key(key: str) -> str:
    """The key of the gain in ``key`` (``return_mean`` → ``return_gain``)."""
    return key.removesuffix("_mean") + "_gain"


def evaluate_agent_run(run_dir: str, cfg, *, env=None, tools=None,
                       temperature: float | None = None, seed: int = 1234,
                       greedy: bool = True, log=print) -> dict:
    """``eval.json`` of an agent run (module doc); ``cfg``: its configuration
    (:func:`ppokit.llm.training.runfiles.config_from_run`)."""
    from ..agents.runner import EVAL_SEED_OFFSET
    from ..training.setup import make_agent
    from .runmodels import eval_models, resolved_for_eval, run_checkpoint

    cfg = named_again(run_dir, cfg, env, tools)
    ckpt, tensors, _ = run_checkpoint(run_dir, log)
    rcfg = resolved_for_eval(cfg)
    runner = make_agent(None, rcfg, None if isinstance(env, str) else env)
    try:
        policy, reference, tok = eval_models(run_dir, rcfg, tensors, ckpt)
        temp = rcfg.temperature if temperature is None else temperature
        seeds = [EVAL_SEED_OFFSET + k for k in range(rcfg.n_eval_prompts)]
        out = {"run_dir": run_dir, "checkpoint": ckpt.name, "env": runner.label,
               "n_prompts": len(seeds), "n_episodes": len(seeds),
               "seeds": [seeds[0], seeds[-1]], "temperature": temp}
        episodes, samples = {}, []
        for prefix, t in [("", temp)] + ([("greedy_", 0.0)] if greedy else []):
            played = {}
            for who, model in (("", policy), ("reference_", reference)):
                player = _Player(rcfg, model, tok, log)
                eps = _play(runner, player, seeds, t, seed)
                played[who] = [_record(ep) for ep in eps]
                if not prefix and not who:
                    samples = [{"prompt": ep.messages[0]["content"],
                                "completion": tok.decode(ep.ids[ep.prompt_len:])}
                               for ep in eps[:N_SAMPLES]]
            out.update(summary(prefix, played[""], played["reference_"]))
            episodes[prefix + "trained"] = played[""]
            episodes[prefix + "reference"] = played["reference_"]
    finally:
        runner.close()
    out["samples"] = samples
    out["episodes"] = episodes
    return out


def named_again(run_dir: str, cfg, env, tools):
    """``cfg`` with the environment and tools the caller named again; a
    :class:`~ppokit.errors.UsageError` where the run's cannot be rebuilt without them."""
    from ..training.runfiles import UNNAMED

    name = cfg.env.removeprefix(UNNAMED)
    again = f"ppokit llm eval {run_dir}"
    if isinstance(env, str) and env.strip() != name:
        raise UsageError(f"--env: this run acts in {name!r}, not {env!r}")
    if env is None and name.startswith("python:"):
        raise UsageError(f"env: {run_dir} acts in {name[7:]!r}, an environment given in "
                         "Python, which a run directory cannot record; evaluate it from "
                         "Python passing it again (ppokit.llm.evaluate_lm_run(RUN_DIR, "
                         "env=..., tools=...))")
    if env is None and cfg.env.startswith(UNNAMED):
        raise UsageError(f"--env: {run_dir} acts in {name!r}, whose module is imported only "
                         f"when you name it: {again} --env {name}")
    recorded = cfg.tools.removeprefix(UNNAMED) if isinstance(cfg.tools, str) else None
    if tools is None and recorded:
        if "python:" in recorded:
            raise UsageError(f"tools: {run_dir} calls {recorded}, functions given in Python, "
                             "which a run directory cannot record; evaluate it from Python "
                             "passing them again (ppokit.llm.evaluate_lm_run(RUN_DIR, "
                             "tools=[...]))")
        raise UsageError(f"--tools: {run_dir} calls {recorded}, imported only when you name "
                         f"them: {again} --tools {recorded}")
    if tools is not None and not recorded:
        raise UsageError(f"--tools: {run_dir} was trained without tools")
    if isinstance(tools, str) and _entries(tools) != _entries(recorded):
        raise UsageError(f"--tools: this run calls {recorded}, not {tools}")
    if tools is not None and not isinstance(tools, str):
        tools = tuple(tools) if isinstance(tools, (list, tuple)) else (tools,)
    return replace(cfg, env=name if env is None or isinstance(env, str) else cfg.env,
                   tools=tools)


def _entries(text: str) -> list[str]:
    return sorted(e.strip() for e in text.split(",") if e.strip())


class _Player:
    """What an agent runner's ``play`` reads of a trainer, for one frozen model: its
    turns sampled in float32, as prompt runs are scored."""

    def __init__(self, cfg, model, tok, log):
        self.cfg, self.policy, self.tok, self.log = cfg, model, tok, log
        self.max_new_tokens = cfg.max_new_tokens

    def autocast(self, precision: str | None = None):
        return contextlib.nullcontext()

    def sample_ids(self, ids, mask, generator=None, temperature=None):
        from ..modeling.rollout import generate

        return generate(self.policy, ids, mask, max_new_tokens=self.max_new_tokens,
                        eos_token_id=self.tok.eos_token_id,
                        pad_token_id=self.tok.pad_token_id,
                        temperature=self.cfg.temperature if temperature is None
                        else temperature, generator=generator)


def _play(runner, player: _Player, seeds: list[int], temperature: float, seed: int) -> list:
    """One episode from each seed, :data:`BATCH` at a time, sampled with one generator."""
    gen = torch.Generator().manual_seed(seed)
    eps = []
    for i in range(0, len(seeds), BATCH):
        eps += runner.play(player, seeds[i:i + BATCH], generator=gen, temperature=temperature)
    return eps


def _record(ep) -> dict:
    from ..agents.rollout import solved

    return {"seed": ep.seed, "return": ep.score, "solved": solved(ep), "turns": ep.turns,
            "terminated": ep.terminated, "truncated": ep.truncated,
            "tool_calls": ep.tool_calls}


def summary(prefix: str, trained: list[dict], reference: list[dict]) -> dict:
    """Each metric of :data:`METRICS` for the trained policy and the reference (the
    episodes of the same seeds, in the same order), with its interval, and the gain."""
    out = {}
    for key, field, binary in METRICS:
        a = [float(r[field]) for r in trained]
        b = [float(r[field]) for r in reference]
        k = prefix + key
        for name, xs in ((k, a), ("reference_" + k, b)):
            out[name] = statistics.fmean(xs)
            out[ci_key(name)] = list(mean_interval(xs, binary=binary))
        diffs = [x - y for x, y in zip(a, b)]
        out[gain_key(k)] = statistics.fmean(diffs)
        out[ci_key(gain_key(k))] = list(mean_interval(diffs, binary=False))
    return out


def agent_eval_lines(ev: dict) -> list[str]:
    """The lines ``ppokit llm eval`` prints of an agent run's ``eval.json``."""
    lines = [f"held-out episodes: {ev['n_episodes']} on seeds training never draws "
             f"(temperature {ev['temperature']}; mean [95 % interval]; gain: trained less "
             "reference, paired by seed)"]
    for prefix in ("", "greedy_"):
        if prefix + "solved_frac" not in ev:
            continue
        head = "  greedy: " if prefix else "  "
        for who, label in (("", "trained  "), ("reference_", "reference"), ("gain", "gain     ")):
            parts = []
            for key, field, _ in METRICS:
                k = gain_key(prefix + key) if who == "gain" else f"{who}{prefix}{key}"
                sign = "+" if who == "gain" else ""
                lo, hi = ev[ci_key(k)]
                parts.append(f"{field} {ev[k]:{sign}.3f} [{lo:{sign}.3f}, {hi:{sign}.3f}]")
            lines.append(f"{head}{label} " + "  ".join(parts))
    return lines
