"""ppokit.llm: token-level RLHF on causal language models, end to end on a CPU.

Where to start:

* :func:`train` (``api.py``): your model, your reward functions (TRL's calling convention,
  ``inputs/rewards.py``) and your prompt dataset (plain or chat, ``inputs/data.py``) -> an
  :class:`LLMRun` with ``generate``, ``evaluate`` and ``save`` (docs/llm_quickstart.md).
* :class:`LLMConfig` + :class:`TokenTrainer` (``training/trainer.py``): one token-level loop
  whose presets are ``ppo`` (critic + :func:`ppokit.core.token_gae`, per-token k1 KL
  reward), ``grpo``, ``dr-grpo``, ``rloo``, ``reinforce++``, ``gspo``, ``cispo`` and
  ``dapo``; :func:`compute_labels` (``labelling/labels.py``) is the pure tensor step from a
  rollout to rewards, advantages and value targets.

The five parts: ``inputs/`` (prompts, tasks, rewards), ``modeling/`` (models, fetching,
the fused forward, sampling and log-prob passes), ``labelling/`` (labels, the mismatch,
dynamic sampling), ``training/`` (the configuration, the trainers, ranks), ``evaluation/``
(held-out scores, comparisons, benchmarks, plots, the demo).

Command line: ``ppokit llm train|compare|eval|sft|rm|dpo|bench|fetch``.
"""

from .api import LLMRun, train, train_agent
from .evaluation.demo import run_reward_hacking_demo
from .evaluation.evaluate import evaluate_lm_run, score_policy
from .inputs.task import ArithmeticTask, ReverseTask, answer_format, correct_answer, reverse_score
from .modeling.models import build_char_tokenizer, build_tiny_model, load_lm, save_policy
from .modeling.rollout import TokenRollout, encode_prompts, generate, sequence_logprobs
from .training.trainer import ALGOS, LLMConfig, TokenTrainer, compute_labels

__all__ = [
    "ALGOS", "ArithmeticTask", "LLMConfig", "LLMRun", "ReverseTask", "answer_format",
    "correct_answer", "train", "train_agent",
    "TokenRollout", "TokenTrainer", "build_char_tokenizer",
    "build_tiny_model", "compute_labels", "encode_prompts", "evaluate_lm_run", "generate",
    "load_lm", "reverse_score", "run_reward_hacking_demo", "save_policy", "score_policy",
    "sequence_logprobs",
]
