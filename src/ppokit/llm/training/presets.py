"""The token trainer's presets as values: the algorithms (each fills the configuration
fields left unset) and the defaults that follow what is trained (the built-in model or a
pretrained one; docs/real_models.md gives the measurements behind them)."""

from __future__ import annotations

__all__ = ["ALGOS", "TRUNCATION", "PRESETS", "MODEL_DEFAULTS", "LEARNING_RATES", "DEPRECATED",
           "TRL_NAMES", "TRL_REFUSED",
           "DEFAULT_MAX_NEW_TOKENS", "OVERLONG_BUFFER"]

ALGOS = ("ppo", "grpo", "dr-grpo", "rloo", "reinforce++", "gspo", "cispo", "dapo")
TRUNCATION = ("none", "bootstrap", "penalty", "mask")

# The algorithm presets are values, not code paths: each fills the fields left at None.
# advantage_estimator / use_critic / normalize_std / kl_mode are the choices that make
# PPO, GRPO, Dr. GRPO, RLOO and REINFORCE++ what they are.
PRESETS = {
    "ppo": {"advantage_estimator": "gae", "use_critic": True, "prompts_per_iter": 64,
            "samples_per_prompt": 1, "kl_mode": "reward", "kl_coef": 0.02,
            "agg": "token-mean", "normalize_advantage": True},
    "grpo": {"advantage_estimator": "grpo", "use_critic": False, "normalize_std": True,
             "prompts_per_iter": 16, "samples_per_prompt": 4, "kl_mode": "loss",
             "kl_coef": 0.02, "agg": "seq-mean-token-mean", "normalize_advantage": False},
    "dr-grpo": {"advantage_estimator": "grpo", "use_critic": False, "normalize_std": False,
                "prompts_per_iter": 16, "samples_per_prompt": 4, "kl_mode": "loss",
                "kl_coef": 0.02, "agg": "seq-mean-token-sum-norm",
                "normalize_advantage": False},
    "rloo": {"advantage_estimator": "rloo", "use_critic": False, "prompts_per_iter": 16,
             "samples_per_prompt": 4, "kl_mode": "reward", "kl_coef": 0.02,
             "agg": "token-mean", "normalize_advantage": False},
    "reinforce++": {"advantage_estimator": "reinforce_pp", "use_critic": False,
                    "prompts_per_iter": 64, "samples_per_prompt": 1, "kl_mode": "reward",
                    "kl_coef": 0.02, "agg": "token-mean", "normalize_advantage": False},
    # GRPO's groups with GSPO's sequence ratio and its own, much narrower clip range
    "gspo": {"advantage_estimator": "grpo", "use_critic": False, "normalize_std": True,
             "prompts_per_iter": 16, "samples_per_prompt": 4, "kl_mode": "loss",
             "kl_coef": 0.02, "agg": "seq-mean-token-mean", "normalize_advantage": False,
             "policy_loss": "gspo", "clip_range": 3e-4, "clip_range_high": 4e-4},
    # GRPO's groups with CISPO's clipped, detached weight: no lower bound, capped above
    "cispo": {"advantage_estimator": "grpo", "use_critic": False, "normalize_std": True,
              "prompts_per_iter": 16, "samples_per_prompt": 4, "kl_mode": "loss",
              "kl_coef": 0.02, "agg": "token-mean", "normalize_advantage": False,
              "policy_loss": "cispo", "clip_range": 1.0, "clip_range_high": 0.28},
    # GRPO's groups without a KL term, clip-higher, token-level aggregation, groups that
    # teach nothing replaced by fresh ones (dynamic sampling), truncated completions left
    # out of the loss and long ones penalised before the cap (OVERLONG_BUFFER)
    "dapo": {"advantage_estimator": "grpo", "use_critic": False, "normalize_std": True,
             "prompts_per_iter": 16, "samples_per_prompt": 4, "kl_mode": "none",
             "kl_coef": 0.0, "agg": "token-mean", "normalize_advantage": False,
             "policy_loss": "clip", "clip_range": 0.2, "clip_range_high": 0.28,
             "dynamic_sampling": True, "truncation": "mask"},
}
# the soft overlong punishment's buffer as a share of the generation cap, per preset
# (DAPO's 4096 of 20480 tokens); the generation cap is the task's, known only when the
# configuration is resolved
OVERLONG_BUFFER = {"dapo": 0.2}

# Defaults that follow what is trained: the built-in tiny model, warm-started in seconds,
# or a pretrained checkpoint (--model, or a model given to ppokit.llm.train), which one
# Adam step at the toy's learning rate wrecks. LoRA trains a pretrained model through
# low-rank adapters beside its frozen weights (the frozen weights are then the reference:
# no copy), and the divergence guard (ppokit/llm/training/divergence.py) undoes an update that
# moves it too far. docs/real_models.md gives the measurements behind the values.
MODEL_DEFAULTS = {
    "builtin": {"lora_r": 0, "guard_kl": 0.0, "guard_grad_norm": 0.0, "temperature": 1.0,
                "n_epochs": 2},
    # a small pretrained model sampled at temperature 1 draws from its noisy tail: on the
    # numbers task SmolLM2-135M-Instruct solves 1.6 % of held-out problems at 1.0, 16 %
    # at 0.7 and 23 % greedily, and groups without a correct answer teach nothing
    # one pass over each batch (as TRL's GRPO default): a sampled completion costs about
    # as much as one training pass over it, and fresh samples teach more than a second pass
    "pretrained": {"lora_r": 16, "guard_kl": 0.5, "guard_grad_norm": 0.0,
                   "temperature": 0.7, "n_epochs": 1},
}
LEARNING_RATES = {"builtin": 2e-4, "lora": 1e-4, "full": 1e-6}
DEFAULT_MAX_NEW_TOKENS = 64  # the generation cap with the user's own prompts


# Names of earlier versions, accepted on the command line, in --set and in TOML with a
# deprecation message (minibatches was a count; batch_size is sequences per minibatch).
DEPRECATED = {"lr": "learning_rate", "epochs": "n_epochs", "clip_eps": "clip_range",
              "lam": "gae_lambda", "whiten_advantages": "normalize_advantage",
              "minibatches": "batch_size"}


# TRL's names (GRPOConfig) with one ppokit key of the same meaning, accepted as they are
# (--set, TOML, ppokit.llm.train keywords); and TRL's names that have no one-to-one
# ppokit key, refused with what to use instead (docs/from_trl.md)
TRL_NAMES = {"num_generations": "samples_per_prompt", "max_completion_length": "max_new_tokens",
             "beta": "kl_coef", "num_iterations": "n_epochs", "epsilon": "clip_range",
             "epsilon_high": "clip_range_high", "gradient_accumulation_steps": "grad_accum"}
TRL_REFUSED = {
    "per_device_train_batch_size": "batch_size is the sequences of one optimiser step (TRL's "
                                   "per_device_train_batch_size x gradient_accumulation_steps "
                                   "x processes)",
    "loss_type": "agg sets the aggregation (TRL's grpo: seq-mean-token-mean, dr_grpo: "
                 "seq-mean-token-sum-norm, dapo: token-mean), or --algo dr-grpo / dapo",
    "scale_rewards": "normalize_std (true: divide by the group's standard deviation)",
    "importance_sampling_level": "policy_loss=gspo (sequence) or the default clip (token)",
    "max_prompt_length": "prompts are never cut; a prompt that leaves no room for the "
                         "completion in the model's context is refused before training",
}
