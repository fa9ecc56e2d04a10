"""The report's tunable limits, one frozen record (every rule reads it)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Thresholds"]


@dataclass(frozen=True)
class Thresholds:
    """Tunable limits of the rules (fractions are in [0, 1], KL in nats).

    Calibration (CartPole-v1, the RL-zoo preset, 100k steps, seeds 0–2): the preset's
    non-annealed median approx_kl is about 0.0016 and its clip fraction about 0.06; with the
    learning rate 30× higher the KL median is 0.028–0.042 (``kl_high_median`` = 0.015, the
    level where a common target KL of 0.01 stops an update with SB3's 1.5× rule); 100× lower
    gives a clip fraction of exactly 0 and approx_kl around 2e-7.

    ``return-collapse`` (same preset, seeds 0, 11 and 18, 100k steps): seed 18 reaches 500
    and ends with its last 15 % of iterations at a median of about 127 — 77 % of what it had
    learned lost — while seed 11's late dip (two iterations at 272 and 53 at the very end)
    is too short to count and seed 0 stays at 500.
    """

    min_iterations: int = 6
    # how far each update moves the policy
    clipfrac_zero_median: float = 0.01
    clipfrac_zero_q90: float = 0.03
    # ... and approx_kl's median below this (a step 100× too small moves the KL 10⁴×
    # less: 2e-7 on CartPole; the built-in model's GRPO preset has a clip fraction of
    # 0.009 over 24 iterations with approx_kl 1.4e-3, a healthy step; the recorded
    # length-hacking run, stalled at the length cap, 1.4e-4)
    clipfrac_zero_kl: float = 2e-4
    clipfrac_high_median: float = 0.3
    kl_high_median: float = 0.015
    kl_rise_corr: float = 0.5
    kl_rise_factor: float = 2.0
    kl_floor: float = 1e-3
    # learning progress and the critic
    return_flat_corr: float = 0.3
    return_flat_rel: float = 0.1
    flat_min_iterations: int = 10
    early_stop_frac: float = 0.5
    ev_near_zero: float = 0.1
    ev_q90_max: float = 0.2
    value_fall_corr: float = -0.5
    value_fall_factor: float = 0.5
    # value-loss-divergence: CartPole's unnormalised value loss peaks near 10³ (returns
    # ≤ 50 at gamma 0.98), LunarLander's near 10⁴; rewards of 10⁵ per step give 2·10¹¹
    value_loss_huge: float = 1e6
    value_rise_factor: float = 10.0
    # exploration, and metrics that move together
    entropy_collapse_frac: float = 0.1
    entropy_collapse_within: float = 0.5
    coupling_corr: float = 0.5
    length_rise_rel: float = 0.2
    truncation_median: float = 0.2
    # return-collapse
    collapse_drop: float = 0.3
    collapse_band: float = 0.1
    collapse_plateau_min: int = 3
    collapse_tail_frac: float = 0.15
    collapse_tail_min: int = 5
    # language-model runs (ppokit.diagnose.lm_rules). Calibration: the built-in tiny model,
    # GRPO's default run, seed 0 (tests/data/README.md): the clip fraction's median is
    # 0.02 (max 0.06); the entropy ends at 16 % of its start, but the score rose 0.61 →
    # 0.86; the KL to the reference ends at 0.42 nats per token; 56 % of the groups end
    # all-equal, with the score still rising over the last half (Spearman 0.43). Provoked:
    # 8 epochs at lr 1e-3 give a median clip fraction of 0.29, lr 5e-3 without KL 2.4
    # nats per token.
    clipfrac_high_median_lm: float = 0.2
    lm_entropy_floor: float = 0.2
    lm_score_gain: float = 0.1
    # completion lengths
    length_explosion_factor: float = 2.0
    length_explosion_min: float = 4.0
    length_collapse_factor: float = 0.5
    length_collapse_min: float = 2.0
    # reward hacking, the reference KL, groups and the sampler
    hacking_rise: float = 0.1
    hacking_drop: float = 0.2
    kl_token_high: float = 1.0
    kl_accel_factor: float = 4.0
    kl_accel_floor: float = 0.5
    zero_spread_median: float = 0.5
    mismatch_k3: float = 1e-3
