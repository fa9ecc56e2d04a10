"""Named registries of interchangeable parts: the recipe's policy losses and advantage
estimators, each a function that receives the recipe's spec.

The names are the configuration values: ``policy_loss = "clip"`` selects
``POLICY_LOSSES.entry("clip")``, ``advantage_estimator = "gae"`` selects
``ADVANTAGES.entry("gae")``; a configuration accepts exactly the names registered when it
is checked, so a part registered by the user's own module (imported by ``--import MODULE``
on the command line, or before training from Python) is a configuration value like the
built-in ones. Adding a loss or an estimator is one function and one registration; no
trainer, engine or configuration file changes (docs/architecture.md#extending).

* **Policy losses**: ``fn(spec, logp, logp_old, advantages, mask=None, **agg) ->
  PolicyLoss``. ``spec`` is the update's :class:`ppokit.engine.UpdateSpec` (clip range,
  scheduled values included); ``agg`` the aggregation keywords of
  :func:`ppokit.core.aggregate`, to be passed on. Declarations: ``kl_anchor="old"`` (the
  loss is PPO-KL's surrogate: the trainer adds the penalty against the old policy and
  adapts its coefficient), ``uses_clip_range`` (the clip range is reported with it),
  ``clip_unit`` (what its ``clipfrac`` counts: ``"token"`` ratios that left the range,
  ``"sequence"`` ratios (GSPO's), or ``"weight"`` — importance weights the clip changed,
  every token keeping its gradient (CISPO's); the token trainer logs the last two as
  ``clipfrac_sequence`` / ``clipfrac_weight``, which the report reads differently).
* **Advantage estimators**, by layout:

  - ``"steps"``: ``fn(steps: Steps, spec: AdvantageSpec) -> (advantages, returns)`` on
    time-major ``[T]`` / ``[T, N]`` transitions. The environment trainer calls it on its
    rollout; the token trainer on each completion's action tokens laid out as one
    episode (:func:`token_advantages`), so one estimator serves both. ``tokens=`` may
    give a native token implementation with the same results (held to the step layout by
    tests).
  - ``"tokens"``: ``fn(tokens: TokenSteps, spec) -> (advantages, returns or None)`` on
    ``[B, L]`` completions (the token trainer only).
  - ``"groups"``: ``fn(scores [B], spec) -> [B]`` over groups of ``spec.group_size``
    completions of one prompt (the token trainer only); broadcast to the action tokens.

  ``needs_critic=True``: the estimator reads the critic's values.

* **Options** (both kinds): ``options={"beta": 0.1}`` declares the part's own
  hyperparameters and their defaults (the type is the default's); the configuration sets
  them in ``loss_options`` / ``advantage_options`` (``--set loss_options.beta=0.3``) and
  the part reads them as ``spec.options`` (:mod:`ppokit.core.options`). An option the
  selected part does not declare, or of the wrong type, is refused by name.

An unknown name raises a ``ValueError`` listing the known names; registering a name twice
is an error.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple

import torch
from torch import Tensor

from . import advantage as _gae
from . import group as _group
from . import losses as _losses
from . import returns as _returns
from . import surrogates as _surrogates
from .options import EMPTY, declare

__all__ = ["Registry", "Entry", "POLICY_LOSSES", "ADVANTAGES", "GROUP_ADVANTAGES",
           "ENV_ADVANTAGES", "NO_CLIP", "AdvantageSpec", "Steps", "TokenSteps",
           "token_advantages", "tokens_as_steps", "register_policy_loss",
           "register_advantage_estimator", "LAYOUTS", "CLIP_UNITS", "clip_unit"]

IMPORT_HINT = ("a part of your own is registered by its module: `--import MODULE` on the "
               "command line, or import it before training from Python")


@dataclass(frozen=True)
class Entry:
    """One registered part: its name, function, one-line help and declarations."""

    name: str
    fn: Callable
    help: str = ""
    meta: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def __getitem__(self, key: str) -> Any:
        return self.meta[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.meta.get(key, default)


class Registry:
    """A name → :class:`Entry` map for functions of one documented signature (its
    ``signature`` string, with the tensors' shapes such as ``[T, N]`` or ``[B, L]``).
    Iterating yields the names, sorted, so a registry (or a :meth:`where` view of it) is a
    configuration's list of allowed values."""

    def __init__(self, kind: str, signature: str, *, _items: dict | None = None,
                 _pred: Callable[[Entry], bool] | None = None, _parent=None,
                 _extra: tuple[str, ...] = ()):
        self.kind = kind
        self.signature = signature
        self._items: dict[str, Entry] = {} if _items is None else _items
        self._pred = _pred
        self._parent = _parent
        self._extra = _extra  # values a configuration accepts that name no entry ("auto")

    def register(self, name: str, fn: Callable | None = None, *, help: str = "",  # noqa: A002
                 **meta: Any):
        """Register ``fn`` under ``name`` (or use as a decorator). ``meta``: the kind's
        declarations (see the module's docstring)."""
        if self._parent is not None:
            raise TypeError("register on the registry itself, not on a filtered view")
        if not isinstance(name, str) or not name.strip() or name != name.strip():
            raise ValueError(f"{self.kind}: a name is a non-empty string without surrounding "
                             f"spaces, got {name!r}")

        def deco(f: Callable) -> Callable:
            if not callable(f):
                raise TypeError(f"{self.kind} {name!r}: expected a function, got {f!r}")
            if name in self._items:
                raise ValueError(f"{self.kind}: {name!r} is already registered")
            doc = help or ((f.__doc__ or "").strip().splitlines() or [""])[0]
            self._items[name] = Entry(name, f, doc, MappingProxyType(dict(meta)))
            return f

        return deco(fn) if fn is not None else deco

    def unregister(self, name: str) -> None:
        """Remove ``name`` (a test's or a notebook's clean-up)."""
        if self._parent is not None:
            raise TypeError("unregister on the registry itself, not on a filtered view")
        self._items.pop(name, None)

    def _visible(self, e: Entry) -> bool:
        return self._pred is None or self._pred(e)

    def entry(self, name: str) -> Entry:
        e = self._items.get(name) if isinstance(name, str) else None
        if e is None or not self._visible(e):
            known = ", ".join(self.names()) or "none"
            hint = "" if e is not None else f" ({IMPORT_HINT})"
            raise ValueError(f"unknown {self.kind} {name!r}; known: {known}{hint}")
        return e

    def get(self, name: str) -> Callable:
        return self.entry(name).fn

    def names(self) -> list[str]:
        return [*self._extra,
                *sorted(n for n, e in self._items.items() if self._visible(e))]

    def entries(self) -> list[Entry]:
        return [self._items[n] for n in self.names() if n not in self._extra]

    def where(self, kind: str, pred: Callable[[Entry], bool] | None = None,
              extra: tuple[str, ...] = ()) -> Registry:
        """A live view of the entries ``pred`` accepts (registrations made later show),
        plus ``extra`` values that name no entry."""
        return Registry(kind, self.signature, _items=self._items, _pred=pred, _parent=self,
                        _extra=tuple(extra))

    def __contains__(self, name: object) -> bool:
        if isinstance(name, str) and name in self._extra:
            return True
        e = self._items.get(name) if isinstance(name, str) else None
        return e is not None and self._visible(e)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self.names())})"


# --------------------------------------------------------------------------- policy losses

NO_CLIP = 1e9  # a clip range no ratio reaches

POLICY_LOSSES = Registry(
    "policy loss", "(spec, logp, logp_old, advantages, mask=None, **agg) -> PolicyLoss")


def register_policy_loss(name: str, fn: Callable | None = None, *, help: str = "",  # noqa: A002
                         kl_anchor: str = "none", uses_clip_range: bool = True,
                         clip_unit: str = "token", options: Mapping[str, Any] | None = None):
    """Register a policy loss ``fn(spec, logp, logp_old, advantages, mask=None, **agg)``
    (tensors ``[M]`` or ``[B, L]``, one shape) returning a :class:`ppokit.core.PolicyLoss`
    (decorator or call). ``kl_anchor="old"``:
    the surrogate of PPO-KL (the trainer adds the penalty to the old policy).
    ``options``: the loss's own hyperparameters and their defaults (``{"beta": 0.1}``;
    :mod:`ppokit.core.options`), set by the configuration's ``loss_options`` and read by
    the loss as ``spec.options["beta"]``."""
    opts = declare(POLICY_LOSSES.kind, name, options)
    if kl_anchor not in ("none", "old"):
        raise ValueError(f"kl_anchor: expected 'none' or 'old', got {kl_anchor!r}")
    if clip_unit not in CLIP_UNITS:
        raise ValueError(f"clip_unit: expected one of {', '.join(CLIP_UNITS)}, got "
                         f"{clip_unit!r}")
    return POLICY_LOSSES.register(name, fn, help=help, kl_anchor=kl_anchor,
                                  uses_clip_range=bool(uses_clip_range), clip_unit=clip_unit,
                                  options=opts)


CLIP_UNITS = ("token", "sequence", "weight")


def clip_unit(policy_loss: str) -> str:
    """What the policy loss ``policy_loss``'s ``clipfrac`` counts (``clip_unit`` of
    :func:`register_policy_loss`; ``"token"`` for a name not registered here)."""
    if policy_loss not in POLICY_LOSSES:
        return "token"
    return POLICY_LOSSES.entry(policy_loss).get("clip_unit", "token")


@register_policy_loss("clip", help="PPO-Clip: -min(ρÂ, clip(ρ, 1-ε_low, 1+ε_high)Â), "
                      "optional dual clip")
def _clip(spec, logp, logp_old, advantages, mask=None, **agg):
    return _losses.clipped_surrogate_loss(
        logp, logp_old, advantages, mask, clip_eps=spec.clip_range,
        clip_eps_high=spec.clip_range_high, dual_clip=spec.dual_clip, **agg)


@register_policy_loss("vanilla", help="-log π(a|s)·Â (REINFORCE, A2C)", uses_clip_range=False)
def _vanilla(spec, logp, logp_old, advantages, mask=None, **agg):
    return _losses.vanilla_pg_loss(logp, logp_old, advantages, mask, **agg)


@register_policy_loss("kl_penalty", help="-ρÂ plus an adaptive KL penalty to the old "
                      "policy (PPO-KL)", kl_anchor="old", uses_clip_range=False)
def _ratio_surrogate(spec, logp, logp_old, advantages, mask=None, **agg):
    """``−ρ Â`` without clipping: PPO-KL's surrogate (its KL penalty is a separate term).
    The clipped loss with a clip range no ratio reaches, so the statistics are the same."""
    return _losses.clipped_surrogate_loss(logp, logp_old, advantages, mask,
                                          clip_eps=NO_CLIP, **agg)


@register_policy_loss("gspo", help="GSPO: one length-normalised ratio per sequence, "
                      "clipped per sequence (clip_range / clip_range_high: the sequence's)",
                      clip_unit="sequence")
def _gspo(spec, logp, logp_old, advantages, mask=None, **agg):
    return _surrogates.gspo_loss(logp, logp_old, advantages, mask, clip_eps=spec.clip_range,
                                 clip_eps_high=spec.clip_range_high,
                                 num_seqs=agg.get("num_seqs"))


@register_policy_loss("gspo_token", help="GSPO-token: the sequence ratio's value with a "
                      "gradient path per token (per-token advantages)", clip_unit="sequence")
def _gspo_token(spec, logp, logp_old, advantages, mask=None, **agg):
    return _surrogates.gspo_loss(logp, logp_old, advantages, mask, clip_eps=spec.clip_range,
                                 clip_eps_high=spec.clip_range_high, token_level=True,
                                 num_seqs=agg.get("num_seqs"))


@register_policy_loss("cispo", help="CISPO: -sg(clip(ρ))·Â·log π on every token "
                      "(clip_range >= 1: no lower bound)", clip_unit="weight")
def _cispo(spec, logp, logp_old, advantages, mask=None, **agg):
    high = spec.clip_range_high if spec.clip_range_high is not None else spec.clip_range
    return _surrogates.cispo_loss(logp, logp_old, advantages, mask, clip_eps=spec.clip_range,
                                  clip_eps_high=high, **agg)


# --------------------------------------------------------------------------- advantages

LAYOUTS = ("steps", "tokens", "groups")


@dataclass(frozen=True)
class AdvantageSpec:
    """What an advantage estimator may read besides its data: the discount, GAE's λ, the
    group size and GRPO's std switch, and ``options``: the estimator's own options (those
    its registration declares, with the configuration's ``advantage_options``). Scalars
    and plain values only: no tensor shape."""

    gamma: float = 0.99
    gae_lambda: float = 0.95
    group_size: int | None = None
    normalize_std: bool = True
    options: Mapping[str, Any] = EMPTY


class Steps(NamedTuple):
    """Time-major transitions, each ``[T]`` or ``[T, N]``: ``values`` / ``next_values`` are
    V(s_t) and V of the transition's real next state (zeros without a critic);
    ``terminated`` stops the bootstrap, ``episode_end`` (terminated or truncated) the
    carry."""

    rewards: Tensor
    values: Tensor
    next_values: Tensor
    terminated: Tensor
    episode_end: Tensor


class TokenSteps(NamedTuple):
    """Completions as ``[B, L]`` rows: per-token ``rewards`` and ``values`` (zeros without
    a critic), the ``mask`` of action tokens, and ``bootstrap`` (``[B]``: the value added
    after a row's last action token, e.g. a truncated completion's; ``None``: 0)."""

    rewards: Tensor
    values: Tensor
    mask: Tensor
    bootstrap: Tensor | None = None


ADVANTAGES = Registry(
    "advantage estimator",
    "steps: (Steps, AdvantageSpec) -> (adv, returns); tokens: (TokenSteps, AdvantageSpec) "
    "-> (adv, returns | None); groups: (scores [B], AdvantageSpec) -> adv [B]")
ENV_ADVANTAGES = ADVANTAGES.where("advantage estimator for environments",
                                  lambda e: e["layout"] == "steps")
GROUP_ADVANTAGES = ADVANTAGES.where("group advantage estimator",
                                    lambda e: e["layout"] == "groups")


def register_advantage_estimator(name: str, fn: Callable | None = None, *,
                                 layout: str = "steps", help: str = "",  # noqa: A002
                                 needs_critic: bool = False, tokens: Callable | None = None,
                                 options: Mapping[str, Any] | None = None):
    """Register an advantage estimator of ``layout`` ``steps`` (time-major ``[T, N]``: both
    trainers), ``tokens`` (``[B, L]``) or ``groups`` (scores ``[B]``) — the token trainer;
    decorator or call. ``tokens``: a native token implementation of a ``steps`` estimator
    (same results, faster). ``options``: the estimator's own options and their defaults,
    set by the configuration's ``advantage_options`` and read as ``spec.options``."""
    opts = declare(ADVANTAGES.kind, name, options)
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {', '.join(LAYOUTS)}, got {layout!r}")
    if tokens is not None and layout != "steps":
        raise ValueError("tokens=: a native token form is for a 'steps' estimator")
    return ADVANTAGES.register(name, fn, help=help, layout=layout,
                               needs_critic=bool(needs_critic), tokens=tokens, options=opts)


def _gae_token_native(ts: TokenSteps, spec: AdvantageSpec):
    return _gae.token_gae(ts.rewards, ts.values, ts.mask, spec.gamma, spec.gae_lambda,
                          bootstrap_values=ts.bootstrap)


@register_advantage_estimator("gae", help="generalised advantage estimation (needs a critic)",
                              needs_critic=True, tokens=_gae_token_native)
def _gae_steps(s: Steps, spec: AdvantageSpec):
    return _gae.gae(s.rewards, s.values, s.next_values, s.terminated, s.episode_end,
                    spec.gamma, spec.gae_lambda)


@register_advantage_estimator("reward_to_go", help="discounted return within the episode "
                              "minus the critic's value when there is one (REINFORCE)")
def _reward_to_go(s: Steps, spec: AdvantageSpec):
    return _returns.reward_to_go_advantages(s.rewards, s.values, s.next_values, s.terminated,
                                            s.episode_end, spec.gamma)


@register_advantage_estimator("reinforce_pp", layout="tokens",
                              help="REINFORCE++: token return-to-go, whitened over the batch")
def _reinforce_pp(ts: TokenSteps, spec: AdvantageSpec):
    return _group.reinforce_pp_advantages(ts.rewards, ts.mask, spec.gamma), None


@register_advantage_estimator("grpo", layout="groups",
                              help="score minus the group mean, over the group std "
                                   "(normalize_std)")
def _grpo(scores, spec: AdvantageSpec):
    return _group.grpo_advantages(scores, spec.group_size, normalize_std=spec.normalize_std)


@register_advantage_estimator("dr_grpo", layout="groups", help="score minus the group mean")
def _dr_grpo(scores, spec: AdvantageSpec):
    return _group.dr_grpo_advantages(scores, spec.group_size)


@register_advantage_estimator("rloo", layout="groups",
                              help="score minus the mean of the group's other scores")
def _rloo(scores, spec: AdvantageSpec):
    return _group.rloo_advantages(scores, spec.group_size)


def tokens_as_steps(ts: TokenSteps) -> tuple[Steps, Tensor, Tensor]:
    """Each completion's action tokens as one episode in the step layout: ``(steps,
    index, valid)`` with ``steps`` time-major ``[L', B]`` (``L'`` the most action tokens in
    a row), ``index`` ``[B, L']`` the token position of each step and ``valid`` its mask.

    A row's action tokens are packed in order (spans outside the mask are skipped, as in
    :func:`ppokit.core.token_gae`); its last action bootstraps from ``bootstrap`` (0 by
    default, which is a terminal step). Steps past a row's end are empty episodes of
    reward 0 and value 0, so every estimator gives them advantage 0."""
    m = ts.mask.bool()
    bsz, length = m.shape
    counts = m.sum(1)
    width = max(int(counts.max()) if bsz else 0, 1)
    # stable sort puts each row's action positions first, in order
    if length == 0:
        raise ValueError("token advantages: completions of length 0")
    index = torch.sort((~m).to(torch.int8), dim=1, stable=True).indices[:, :width]
    valid = torch.arange(width)[None, :] < counts[:, None]
    zero = torch.zeros((), dtype=ts.rewards.dtype)
    r = torch.where(valid, ts.rewards.gather(1, index), zero)
    v = torch.where(valid, ts.values.to(r.dtype).gather(1, index), zero)
    last = valid & ~torch.cat([valid[:, 1:], torch.zeros(bsz, 1, dtype=torch.bool)], 1)
    boot = (torch.zeros(bsz, dtype=r.dtype) if ts.bootstrap is None
            else ts.bootstrap.to(r.dtype))
    nv = torch.cat([v[:, 1:], torch.zeros(bsz, 1, dtype=r.dtype)], 1)
    nv = torch.where(last, boot[:, None].expand_as(nv), nv)
    end = last | ~valid
    steps = Steps(r.T.contiguous(), v.T.contiguous(), nv.T.contiguous(),
                  (~valid).T.contiguous(), end.T.contiguous())
    return steps, index, valid


def token_advantages(entry: Entry, ts: TokenSteps, spec: AdvantageSpec
                     ) -> tuple[Tensor, Tensor | None]:
    """``(advantages, returns)`` ``[B, L]`` (0 off the mask) of a ``steps`` or ``tokens``
    estimator on completions: the native token form when it has one, else the step form on
    :func:`tokens_as_steps`."""
    layout = entry["layout"]
    if layout == "groups":
        raise ValueError(f"advantage estimator {entry.name!r} works on groups of scores")
    native = entry.fn if layout == "tokens" else entry.get("tokens")
    if native is not None:
        return native(ts, spec)
    steps, index, valid = tokens_as_steps(ts)
    adv_s, ret_s = entry.fn(steps, spec)
    zero = torch.zeros((), dtype=ts.rewards.dtype)

    def back(x: Tensor) -> Tensor:
        out = torch.zeros(ts.mask.shape, dtype=ts.rewards.dtype)
        vals = torch.where(valid, x.T.to(out.dtype), zero)
        return out.scatter_add(1, index, vals)

    return back(adv_s), (None if ret_s is None else back(ret_s))
