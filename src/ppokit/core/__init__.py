"""ppokit.core: the tensor math every algorithm shares (torch + numpy only, no I/O).

REINFORCE, A2C, PPO, GRPO and RLOO differ in three choices — how the advantage is estimated,
how the probability ratio is computed, how far the policy may move — and this package holds
the parts for each. Shape conventions: ``[T]`` / ``[T, N]`` time-major for environments,
``[B, L]`` for tokens (with an action mask). See docs/architecture.md.
"""

from .advantage import gae, td_residuals, token_gae, token_gae_reference
from .group import (
    broadcast_to_tokens,
    dr_grpo_advantages,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
)
from .kl import (
    DEFAULT_KL_LOSS_ESTIMATOR,
    KL_ESTIMATORS,
    KL_LOSS_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    ProportionalKLController,
    categorical_kl,
    kl_estimate,
    kl_k1,
    kl_k2,
    kl_k3,
)
from .losses import (
    AGGREGATION_MODES,
    LossTerms,
    PolicyLoss,
    aggregate,
    approx_kl,
    clip_fractions,
    clipped_surrogate_loss,
    entropy_bonus,
    kl_penalty_loss,
    ppo_kl_penalty_loss,
    ratio_stats,
    value_loss,
    vanilla_pg_loss,
)
from .registry import (
    ADVANTAGES,
    ENV_ADVANTAGES,
    GROUP_ADVANTAGES,
    POLICY_LOSSES,
    AdvantageSpec,
    Registry,
    Steps,
    TokenSteps,
    register_advantage_estimator,
    register_policy_loss,
    token_advantages,
)
from .returns import discount_weights, discounted_return, reward_to_go
from .scan import discounted_reverse_cumsum
from .stats import explained_variance, masked_mean, masked_sum, masked_var, masked_whiten

__all__ = [
    "ADVANTAGES", "AdvantageSpec", "Steps", "TokenSteps", "register_advantage_estimator",
    "register_policy_loss", "token_advantages",
    "AGGREGATION_MODES", "AdaptiveKLController", "DEFAULT_KL_LOSS_ESTIMATOR", "ENV_ADVANTAGES",
    "FixedKLController", "GROUP_ADVANTAGES", "KL_ESTIMATORS", "KL_LOSS_ESTIMATORS", "LossTerms",
    "POLICY_LOSSES", "PolicyLoss",
    "ProportionalKLController", "Registry", "aggregate", "approx_kl", "broadcast_to_tokens",
    "categorical_kl", "clip_fractions", "clipped_surrogate_loss", "discount_weights",
    "discounted_return", "discounted_reverse_cumsum", "dr_grpo_advantages", "entropy_bonus",
    "explained_variance", "gae", "grpo_advantages", "kl_estimate", "kl_k1", "kl_k2", "kl_k3",
    "kl_penalty_loss", "masked_mean", "masked_sum", "masked_var", "masked_whiten",
    "ppo_kl_penalty_loss", "ratio_stats", "reinforce_pp_advantages", "reward_to_go",
    "rloo_advantages", "td_residuals", "token_gae", "token_gae_reference", "value_loss",
    "vanilla_pg_loss",
]
