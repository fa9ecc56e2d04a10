"""Pre-flight checks of a language-model run's configuration, before any training.

Given the run's :class:`ppokit.llm.training.config.LLMConfig` (as ``ppokit llm train``
would get it),
the starting model and tokenizer, they read the configuration, the prompts and a small
sample of completions:

* ``lm-group-size``: a group estimator (grpo, dr-grpo, rloo) normalises each score within
  its group of ``samples_per_prompt`` completions; with one per prompt every advantage is
  0 (FAIL).
* ``lm-kl-reference``: a KL coefficient (``kl_coef`` > 0 or ``kl_target``) set while
  ``kl_mode = none``: there is no KL term against the reference for it to weigh (FAIL).
* ``lm-reward-constant``: ``prompts`` × ``samples`` completions of sampled training prompts
  (the configured temperature and ``max_new_tokens``) scored by the run's rewards: a
  reward function that returns one value for all of them (FAIL), most groups with
  all-equal totals (WARN: a group estimator learns nothing from them).
* ``lm-truncation``: most of those completions reach ``max_new_tokens`` (WARN).
* ``lm-chat-template``: conversation prompts (lists of messages) with a tokenizer that has
  no chat template, or whose template leaves a message's text out of the rendered prompt
  (FAIL).
* ``lm-prompt-length``: prompts that, with ``max_new_tokens``, do not fit the model's
  context (``max_position_embeddings`` / ``n_positions``) (FAIL).
"""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np

from .result import CheckResult

__all__ = ["run_config_checks", "LENGTH_ROWS", "TRUNCATED_MOST", "ZERO_SPREAD_MOST"]

LENGTH_ROWS = 5000        # prompts whose token length is measured (all, up to this many)
TRUNCATED_MOST = 0.5
ZERO_SPREAD_MOST = 0.5


def _ok(name, measured, crit, **values) -> CheckResult:
    return CheckResult(name, True, measured, crit, "", values)


def _fail(name, measured, crit, detail, fix, warn=False, **values) -> CheckResult:
    return CheckResult(name, True if warn else False, measured, crit, detail, values,
                       warn=warn, fix=fix)


def _skip(name, crit, why) -> CheckResult:
    return CheckResult(name, None, "-", crit, why)


def _recipe(cfg) -> tuple[str, str | None, int | None]:
    """``(algo, advantage_estimator, samples_per_prompt)`` as ``ppokit llm train`` would
    resolve them: the algorithm's default for the model (grpo for a pretrained ``model``
    or a prompts file, ppo for the built-in model) and the preset's and the model kind's
    defaults for the fields left unset, without validating the rest."""
    from ppokit.llm.training.config import MODEL_DEFAULTS, PRESETS

    pretrained = cfg.model is not None
    algo = cfg.algo or ("grpo" if pretrained or cfg.prompts is not None else "ppo")
    preset = {**MODEL_DEFAULTS["pretrained" if pretrained else "builtin"],
              **PRESETS.get(algo, {})}
    est = cfg.advantage_estimator or preset.get("advantage_estimator")
    g = cfg.samples_per_prompt or preset.get("samples_per_prompt")
    return algo, est, g


def check_group_size(cfg) -> CheckResult:
    from ppokit.core.registry import GROUP_ADVANTAGES

    name, crit = "lm-group-size", "a group estimator gets ≥ 2 samples per prompt"
    algo, est, g = _recipe(cfg)
    if est not in GROUP_ADVANTAGES:
        return _ok(name, f"{algo}: {est} estimator, {g} sample(s) per prompt (no groups "
                   "needed)", crit, algo=algo, estimator=est, samples_per_prompt=g)
    if g is not None and g < 2:
        return _fail(name, f"{algo}: {est} estimator with samples_per_prompt = {g}",
                     crit, f"the {est} estimator scores each completion against the other "
                     "completions of its prompt; with one per prompt every advantage is 0 "
                     "(or undefined) and nothing is learned",
                     "--samples-per-prompt 4 (or more), or algo reinforce++/ppo for one "
                     "sample per prompt", algo=algo, estimator=est, samples_per_prompt=g)
    return _ok(name, f"{algo}: {est} estimator, {g} samples per prompt", crit, algo=algo,
               estimator=est, samples_per_prompt=g)


def check_kl_reference(cfg, rcfg) -> CheckResult:
    name, crit = "lm-kl-reference", "a KL coefficient has a KL term to weigh"
    set_beta = cfg.kl_coef is not None and cfg.kl_coef > 0
    if rcfg.kl_mode == "none" and (set_beta or cfg.kl_target is not None):
        what = (f"kl_coef = {cfg.kl_coef:g}" if set_beta else
                f"kl_target = {cfg.kl_target:g}")
        return _fail(name, f"{what} with kl_mode = none", crit,
                     f"{what} is set, but kl_mode = none leaves the KL to the reference out "
                     "of both the reward and the loss: nothing holds the policy near the "
                     "reference, whatever the coefficient says",
                     "--kl-mode reward (per-token k1 in the reward) or loss (k3 in the "
                     "loss), or drop the coefficient", kl_coef=cfg.kl_coef,
                     kl_target=cfg.kl_target)
    if rcfg.kl_mode == "none":
        return _ok(name, "kl_mode = none, no coefficient set", crit)
    beta = rcfg.kl_coef
    adaptive = f", adaptive towards {rcfg.kl_target:g}" if rcfg.kl_target else ""
    return _ok(name, f"kl_mode = {rcfg.kl_mode}, β = {beta:g}{adaptive}, against the frozen "
               "starting policy", crit, kl_mode=rcfg.kl_mode, kl_coef=beta)


def _is_chat(row) -> bool:
    return isinstance(row, dict) and isinstance(row.get("prompt"), list)


def check_chat_template(rows: list, tokenizer) -> CheckResult:
    name, crit = "lm-chat-template", "conversation prompts have a chat template"
    chat = sum(_is_chat(r) for r in rows)
    has = bool(getattr(tokenizer, "chat_template", None))
    if chat and not has:
        return _fail(name, f"{chat} of {len(rows)} prompts are conversations; the tokenizer "
                     "has no chat template", crit,
                     "conversation prompts (lists of {role, content} messages) are rendered "
                     "with the tokenizer's chat template, and this tokenizer has none",
                     "use the instruction-tuned model's tokenizer (it carries the "
                     "template), set tokenizer.chat_template, or give plain-text prompts",
                     conversations=chat)
    lost = _dropped_by_template(rows, tokenizer) if chat else None
    if lost is not None:
        i, role = lost
        return _fail(name, f"prompt {i}: its {role} message is not in the prompt the chat "
                     "template renders", crit,
                     f"the tokenizer's chat template leaves the {role} message's text out "
                     "of the rendered prompt: the model never sees what it is asked",
                     "fix the template (it must render every message's content), or use "
                     "the model's own tokenizer", conversations=chat, row=i, role=role)
    kind = f"{chat} conversations, chat template present" if chat else "plain-text prompts"
    return _ok(name, f"{len(rows)} prompts: {kind}", crit, conversations=chat)


TEMPLATE_ROWS = 50  # conversations rendered to see that the template keeps every message


def _dropped_by_template(rows: list, tokenizer) -> tuple[int, str] | None:
    """``(row, role)`` of the first message (of the first :data:`TEMPLATE_ROWS`
    conversations) whose text the rendered prompt does not contain; None when all do."""
    from ppokit.llm.inputs.data import render_prompt

    for i, r in enumerate([r for r in rows if _is_chat(r)][:TEMPLATE_ROWS]):
        text = render_prompt(tokenizer, r["prompt"])
        for m in r["prompt"]:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, str) and content.strip() and content.strip() not in text:
                return i, str(m.get("role", "?"))
    return None


def _context(model) -> int | None:
    conf = getattr(model, "config", None)
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        v = getattr(conf, key, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


def check_prompt_length(rows: list, tokenizer, model, max_new_tokens: int) -> CheckResult:
    from ppokit.llm.inputs.data import render_prompt

    name = "lm-prompt-length"
    crit = "longest prompt + max_new_tokens ≤ the model's context"
    ctx = _context(model)
    if ctx is None:
        return _skip(name, crit, "the model's configuration names no context length")
    bos = tokenizer.bos_token_id
    lengths = []
    for r in rows[:LENGTH_ROWS]:
        ids = tokenizer(render_prompt(tokenizer, r["prompt"]),
                        add_special_tokens=False)["input_ids"]
        lengths.append(len(ids) + (bos is not None and (not ids or ids[0] != bos)))
    lengths = np.asarray(lengths)
    room = ctx - max_new_tokens
    over = int((lengths > room).sum())
    measured = (f"prompts {int(lengths.min())}–{int(lengths.max())} tokens (of "
                f"{len(lengths)}), + max_new_tokens {max_new_tokens}, context {ctx}")
    values = {"context": ctx, "longest": int(lengths.max()), "over": over,
              "max_new_tokens": max_new_tokens, "measured_rows": len(lengths)}
    if over:
        return _fail(name, measured, crit,
                     f"{over} of {len(lengths)} prompts leave fewer than max_new_tokens = "
                     f"{max_new_tokens} positions of the model's {ctx}: generation runs "
                     "past the positions the model was trained on (or fails)",
                     "shorten or filter the long prompts, lower max_new_tokens, or use a "
                     "model with a longer context", **values)
    return _ok(name, measured, crit, **values)


def _sample_rows(cfg, task, train_rows, n: int, seed: int) -> list:
    rng = random.Random(seed)
    if task is not None:
        return [task.row(p) for p in task.train_prompts(n, rng)]
    return [train_rows[rng.randrange(len(train_rows))] for _ in range(n)]


def check_sampled(rcfg, model, tokenizer, rewards, rows: list, *, max_new_tokens: int,
                  samples: int, seed: int) -> list[CheckResult]:
    """``lm-reward-constant`` and ``lm-truncation`` on ``len(rows)`` prompts × ``samples``
    completions (rows with the same prompt follow each other: the groups, which matter
    when the run's estimator is a group estimator)."""
    from ppokit.core.registry import GROUP_ADVANTAGES
    from ppokit.llm.evaluation.evaluate import score_policy

    group_rows = [r for r in rows for _ in range(samples)]
    n = len(group_rows)
    name, crit = "lm-reward-constant", "every reward runs and varies; most groups differ"
    try:
        out = score_policy(model, tokenizer, group_rows, rewards,
                           max_new_tokens=max_new_tokens, temperature=rcfg.temperature,
                           seed=seed, per_sample=True)
    except Exception as exc:  # noqa: BLE001 - the user's reward on real completions
        msg = str(exc).splitlines()[0][:200] if str(exc) else ""
        err = f"{type(exc).__name__}{': ' + msg if msg else ''}"
        return [_fail(name, f"the rewards raised {type(exc).__name__} on {n} sampled "
                      "completions", crit, f"scoring sampled completions raised {err}",
                      "call the reward function on the completions ppokit passes "
                      "(docs/llm_quickstart.md: plain strings, or a list with one "
                      "assistant message for conversation prompts)", error=err),
                _skip("lm-truncation", "-", "the rewards raised (lm-reward-constant)")]
    total = np.asarray(out["scores"]).reshape(len(rows), samples)
    zero = float((np.ptp(total, axis=1) == 0).mean())
    # each function's range over the completions it scored (None: it scored none)
    ranges = {}
    for k, v in out["per_function"].items():
        v = np.asarray(v, dtype=float)
        v = v[~np.isnan(v)]
        ranges[k] = (float(v.min()), float(v.max())) if len(v) else None
    # a function of weight 0 adds nothing to the score the policy learns from: it is
    # logged (reward/NAME), never judged
    unweighted = sorted(f.name for f in rewards.funcs if f.weight == 0)
    values = {"completions": n, "zero_spread_frac": zero, "ranges": ranges,
              "weight_zero": unweighted}
    constant = [(k, r) for k, r in ranges.items()
                if r is not None and r[0] == r[1] and k not in unweighted]
    spread = ", ".join(f"{k} {r[0]:.3g}…{r[1]:.3g}" for k, r in ranges.items()
                       if r and k not in unweighted)
    if unweighted:
        spread += f" (weight 0, logged only: {', '.join(unweighted)})"
    measured = f"{n} completions ({len(rows)} prompts × {samples}): {spread}"
    if constant:
        k, r = constant[0]
        res = _fail(name, measured, crit,
                    f"reward {k} returned {r[0]:.6g} for all {n} sampled "
                    "completions: it adds a constant to every score, and if it is the only "
                    "reward there is nothing to learn from",
                    "check the function against real completions (their format, the "
                    "answer column it compares with); give partial credit if exact "
                    "answers are out of reach", **values)
    elif rcfg.advantage_estimator in GROUP_ADVANTAGES and zero >= ZERO_SPREAD_MOST:
        res = _fail(name, measured + f"; {zero:.0%} of groups all-equal", crit,
                    f"{zero:.0%} of the sampled groups score all their completions alike: a "
                    "group estimator gives them advantage 0, so most of each batch teaches "
                    "nothing", "graded rewards (partial credit), more samples per prompt, "
                    "or prompts at the model's level", warn=True, **values)
    else:
        res = _ok(name, measured + f"; {zero:.0%} of groups all-equal", crit, **values)
    trunc = float(np.mean(out["truncated"]))
    tname = "lm-truncation"
    tcrit = f"≤ {TRUNCATED_MOST:.0%} of sampled responses reach max_new_tokens"
    tvalues = {"truncated_frac": trunc, "max_new_tokens": max_new_tokens,
               "response_length_mean": out["response_length_mean"]}
    tmeasured = (f"{trunc:.0%} of {n} responses cut at max_new_tokens = {max_new_tokens} "
                 f"(mean length {out['response_length_mean']:.3g})")
    if trunc > TRUNCATED_MOST:
        tres = _fail(tname, tmeasured, tcrit,
                     f"most sampled responses ({trunc:.0%}) are cut at max_new_tokens = "
                     f"{max_new_tokens} before their end: they are scored unfinished "
                     f"(truncation = {rcfg.truncation}) and the policy learns from answers "
                     "it never completed",
                     "raise max_new_tokens, or check that the model ends with EOS (a base "
                     "model may need its chat template or an SFT warm start)", warn=True,
                     **tvalues)
    else:
        tres = _ok(tname, tmeasured, tcrit, **tvalues)
    return [res, tres]


def run_config_checks(cfg, model, tokenizer, *, reward_fn=None, prompts: int = 8,
                      samples: int = 4, seed: int = 0, log=None) -> list[CheckResult]:
    """The checks of the module documentation on ``cfg`` (an unresolved
    :class:`ppokit.llm.training.config.LLMConfig`: the preset is applied here, so that a field the
    preset cannot accept is a finding, not an error), starting from ``model``."""
    from ppokit.llm.inputs.reward_setup import reward_set
    from ppokit.llm.inputs.task import make_task
    from ppokit.llm.training.runfiles import prompt_sets

    log = log or (lambda *a: None)
    group = check_group_size(cfg)
    if group.passed is False:   # the rest is checked as if the group had 2 samples
        cfg = replace(cfg, samples_per_prompt=2)
    rcfg = cfg.resolved()
    results = [group, check_kl_reference(cfg, rcfg)]
    task = make_task(rcfg.task, rcfg.task_options) if rcfg.prompts is None else None
    train_rows, eval_rows = prompt_sets(rcfg)
    rows = list(train_rows) if train_rows is not None else [
        task.row(p) for p in task.train_prompts(256, random.Random(seed))]
    rows += list(eval_rows)
    max_new = rcfg.max_new_tokens or (task.max_new_tokens if task else 64)
    template = check_chat_template(rows, tokenizer)
    names = ("lm-reward-constant", "lm-truncation", "lm-prompt-length")
    if template.passed is False:
        why = "the prompts cannot be rendered (lm-chat-template)"
        return results + [template] + [_skip(n, "-", why) for n in names]
    length = check_prompt_length(rows, tokenizer, model, max_new)
    rewards = reward_set(rcfg, reward_fn, task, log=log)
    rewards.check_signatures(sorted({k for r in rows for k in r}))
    g = rcfg.samples_per_prompt if rcfg.samples_per_prompt > 1 else samples
    picked = _sample_rows(rcfg, task, train_rows, prompts, seed)
    if length.passed is False:
        sampled = [_skip(n, "-", "prompts do not fit the context (lm-prompt-length)")
                   for n in names[:2]]
    else:
        was = model.training
        model.eval()
        try:
            sampled = check_sampled(rcfg, model, tokenizer, rewards, picked,
                                    max_new_tokens=max_new, samples=g, seed=seed)
        finally:
            model.train(was)
    return results + [template] + sampled + [length]
