"""Every code ``ppokit check`` reports, with one line each (``ppokit check --list-codes``;
docs/checks.md gives an example of what each catches).

A :class:`ppokit.checks.CheckResult`'s ``name`` is one of these codes; they are stable.
"""

from __future__ import annotations

__all__ = ["CHECKS", "GROUPS"]

GROUPS: dict[str, dict[str, str]] = {
    "policy (ppokit check, ppokit check RUN_DIR)": {
        "ratio-identity": "log-probs at collection and at update agree (ratio 1, KL 0)",
        "zero-advantage-gradient": "zero advantages give exactly zero policy gradient",
        "flipped-advantage-direction": "a step raises positive-advantage actions' log-probs",
        "surrogate-finite-difference": "the surrogate's gradient matches finite differences",
        "labels-frozen": "advantages, targets and old log-probs identical in every epoch",
    },
    "environment (ppokit check --env ID, ppokit.check_env)": {
        "env-api": "Gymnasium's own API checker passes",
        "env-exception": "reset and step never raise during the run",
        "time-limit-terminated": "no time limit reported as terminated=True",
        "obs-outside-space": "every observation inside observation_space",
        "env-nonfinite": "no NaN or infinity in observations or rewards",
        "obs-scale": "observation features on a scale a network takes as it is",
        "reward-scale": "rewards on a workable scale, not all 0",
        "seed-determinism": "same seed and actions replay; another seed differs",
        "reset-options": "reset(seed, options={}) starts where reset(seed) does",
        "info-keys": "no reserved info key; info values picklable",
        "action-bounds": "Box action bounds a Gaussian policy can cover",
        "step-after-end": "step() after an episode ended refuses or reports the end",
        "env-speed": "steps per second, and the vectorisation it suggests",
        "action-mask": "action masks well formed, never empty, their actions accepted",
    },
    "language model: token layout (ppokit check --lm / --model DIR)": {
        "token-action-mask": "action mask on generated tokens only",
        "token-ratio-identity": "whole-batch and micro-batch log-probs agree",
        "padding-invariance": "padding contents change neither loss nor log-probs",
        "token-labels-frozen": "the token trainer's labels frozen across epochs",
    },
    "language model: the run's configuration (ppokit check --lm / --model DIR)": {
        "lm-group-size": "a group estimator has at least 2 samples per prompt",
        "lm-kl-reference": "a KL coefficient has a KL term to weigh",
        "lm-reward-constant": "the rewards vary on sampled completions",
        "lm-truncation": "most sampled responses end before max_new_tokens",
        "lm-chat-template": "conversation prompts have a chat template to render them",
        "lm-prompt-length": "prompts plus max_new_tokens fit the model's context",
    },
}
CHECKS: dict[str, str] = {code: line for group in GROUPS.values()
                          for code, line in group.items()}
