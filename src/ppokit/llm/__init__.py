"""ppokit.llm: token-level RLHF on causal language models, end to end on a CPU.

Where to start:

* :func:`train` (``api.py``): your model, your reward functions (TRL's calling convention,
  ``rewards.py``) and your prompt dataset (plain or chat, ``data.py``) -> an
  :class:`LLMRun` with ``generate``, ``evaluate`` and ``save`` (docs/llm_quickstart.md).

* :class:`LLMConfig` + :class:`TokenTrainer` (``trainer.py``): one token-level loop whose
  presets are ``ppo`` (critic + :func:`ppokit.core.token_gae`, per-token k1 KL reward),
  ``grpo``, ``dr-grpo``, ``rloo`` and ``reinforce++``; :func:`compute_labels` is the pure
  tensor step from a rollout to rewards, advantages and value targets.
* ``rollout.py``: left-padded batched sampling with a KV cache, completion masks, the
  forward pass that gives old / reference log-probs (``[B, L]`` token layout).
* ``models.py``: the built-in tiny Llama/GPT-2 model and character tokenizer, loading a
  local Hugging Face causal LM directory (never remote code), the critic.
* ``task.py``: the built-in task (reverse a digit string; partial-credit score in [0, 1]).
* ``sft.py``, ``rm.py``, ``dpo.py``: warm start, Bradley–Terry reward model, DPO.
* ``evaluate.py``: trained vs reference on held-out prompts (``eval.json``).
* ``demo.py``: :func:`run_reward_hacking_demo`; ``bench.py``: throughput.

Command line: ``ppokit llm train|eval|sft|rm|dpo|bench``.
"""

from .api import LLMRun, train
from .demo import run_reward_hacking_demo
from .evaluate import evaluate_lm_run, score_policy
from .models import build_char_tokenizer, build_tiny_model, load_lm, save_policy
from .rollout import TokenRollout, encode_prompts, generate, sequence_logprobs
from .task import ArithmeticTask, ReverseTask, answer_format, correct_answer, reverse_score
from .trainer import ALGOS, LLMConfig, TokenTrainer, compute_labels

__all__ = [
    "ALGOS", "ArithmeticTask", "LLMConfig", "LLMRun", "ReverseTask", "answer_format",
    "correct_answer", "train", "TokenRollout", "TokenTrainer", "build_char_tokenizer",
    "build_tiny_model", "compute_labels", "encode_prompts", "evaluate_lm_run", "generate",
    "load_lm", "reverse_score", "run_reward_hacking_demo", "save_policy", "score_policy",
    "sequence_logprobs",
]
