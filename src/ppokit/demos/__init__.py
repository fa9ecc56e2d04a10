"""ppokit.demos: the worked experiments of docs/theory.md, computed with ppokit's own functions.

Each module computes its numbers with :mod:`ppokit.core` (GAE, the clipped surrogate, KL
estimators) and returns plain dataclasses; ``format_*`` functions render them as the
aligned tables that ``ppokit demo NAME`` prints. :mod:`ppokit.demos.figures` writes PNGs.

Modules: ``gae`` (fixed trajectory, λ bias–variance, analytic moments), ``clip``,
``bandit``, ``baseline``, ``optimal_baseline``, ``reward_to_go``, ``learned_baseline``,
``kl``, ``kl_vs_clip``, ``rlhf``, ``figures``, ``cli``. The maths of the variance-reduction
demos is written out in docs/demos.md.
"""

from .cli import DEMOS, render

__all__ = ["DEMOS", "render"]
