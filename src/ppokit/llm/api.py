"""The Python entry point of token-level RL: :func:`train` (your model, your rewards, your
data) and the :class:`LLMRun` it returns (``generate``, ``evaluate``, ``save``).

``train`` is a thin layer over :class:`ppokit.llm.training.trainer.TokenTrainer`: it loads the model
and the dataset, turns the keyword arguments into an :class:`LLMConfig` (the same keys as
``ppokit llm train``'s flags, with the same checks and messages), trains and hands back the
trained policy. The run directory is an ordinary ``ppokit llm`` run directory.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import torch

from ppokit.errors import UsageError

__all__ = ["train", "train_agent", "LLMRun"]

# keys train() takes as its own arguments, not through **config
_ARGUMENT_KEYS = {"model": "model", "prompts": "train_dataset", "eval_prompts": "eval_dataset",
                  "reward": "reward_funcs", "reward_model": "reward_funcs"}


def train(model, reward_funcs, train_dataset, algo: str = "grpo", eval_dataset=None,
          tokenizer=None, run_dir=None, callbacks=(), *, progress: bool = False, log=print,
          **config) -> LLMRun:
    """Train ``model`` with ``algo`` on the prompts of ``train_dataset`` against
    ``reward_funcs``; returns an :class:`LLMRun`.

    * ``model``: a local model directory, or a loaded ``transformers`` causal LM (then
      ``tokenizer`` too, unless the model was loaded from a local directory that has one).
    * ``reward_funcs``: one or a list of reward functions (TRL's calling convention, see
      :mod:`ppokit.llm.inputs.rewards`), ``"module:function"`` strings or reward-model
      directories; ``reward_weights=[...]`` weighs them.
    * ``train_dataset`` / ``eval_dataset``: a JSONL/JSON/CSV/Parquet path, a
      ``datasets.Dataset`` or a list of dicts with a ``prompt`` column
      (:mod:`ppokit.llm.inputs.data`). Without ``eval_dataset`` the last ``eval_fraction`` (0.1)
      of the rows is held out, and said so.
    * ``callbacks``: functions called with each iteration's metrics record; one that
      returns ``True`` or ``"stop"`` stops training (a checkpoint is written).
    * ``**config``: any :class:`LLMConfig` key (``iterations``, ``learning_rate``,
      ``samples_per_prompt``, ``max_new_tokens``, ...).
    """
    from ppokit.errors import require_extra

    require_extra(("transformers", "tokenizers"), "llm", "ppokit.llm.train")
    from .inputs.data import load_rows
    from .modeling.models import load_lm, load_tokenizer, quiet_transformers
    from .training.config_values import config_from_values

    quiet_transformers()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    for key, arg in _ARGUMENT_KEYS.items():
        if key in config:
            raise UsageError(f"{key}: give it as train({arg}=...), not as a config key")
    from ppokit.cliutil import check_callbacks

    callbacks = check_callbacks(callbacks, "(record) -> bool | None")
    funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    if not funcs:
        raise UsageError("reward_funcs: expected at least one reward function")
    train_rows = load_rows(train_dataset, "train_dataset")
    eval_rows = None if eval_dataset is None else load_rows(eval_dataset, "eval_dataset")
    model_dir = os.fspath(model) if isinstance(model, (str, os.PathLike)) else None
    values = {"algo": algo, "model": model_dir, "reward": tuple(funcs),
              "prompts": (os.fspath(train_dataset) if isinstance(train_dataset,
                                                                   (str, os.PathLike))
                          else f"<{type(train_dataset).__name__} of {len(train_rows)} rows>")}
    if eval_dataset is not None:
        values["eval_prompts"] = (os.fspath(eval_dataset) if isinstance(eval_dataset,
                                                                        (str, os.PathLike))
                                  else f"<{type(eval_dataset).__name__}>")
    cfg = config_from_values(("train()", values), ("train()", config))
    cfg = cfg.resolved(pretrained=True)  # the user's model: a pretrained checkpoint's defaults
    if model_dir is not None:
        policy, tok = load_lm(model_dir)
        if tokenizer is not None:
            tok = _prepare_tokenizer(tokenizer)
    elif isinstance(model, torch.nn.Module) and hasattr(model, "config"):
        policy = model
        if tokenizer is None:
            src = getattr(model, "name_or_path", None) or getattr(model.config,
                                                                 "_name_or_path", None)
            if not src or not os.path.isdir(src):
                raise UsageError("tokenizer: a loaded model needs its tokenizer "
                                 "(train(model, ..., tokenizer=tok))")
            tok = load_tokenizer(src)
        else:
            tok = _prepare_tokenizer(tokenizer)
        if getattr(policy.config, "pad_token_id", None) is None:
            policy.config.pad_token_id = tok.pad_token_id
    else:
        raise UsageError(f"model: expected a local model directory or a transformers model, "
                         f"got {type(model).__name__}")
    return _run(cfg, run_dir, "llm", progress, log, policy=policy, tokenizer=tok,
                train_rows=train_rows, eval_rows=eval_rows, callbacks=callbacks)


def _run(cfg, run_dir, kind: str, progress: bool, log, **trainer_kw) -> LLMRun:
    """Train ``cfg`` into ``run_dir`` (a new ``runs/KIND-ALGO-...`` when None)."""
    from ppokit.io import unique_run_dir

    from .training.trainer import TokenTrainer

    fresh = run_dir is None
    run_dir = str(unique_run_dir("runs", f"{kind}-{cfg.algo}")) if fresh else str(run_dir)
    tr = TokenTrainer(cfg, run_dir, log=log, fresh=fresh, **trainer_kw)
    log(f"run dir: {run_dir}")
    try:
        history = tr.train(progress=progress)
    finally:
        tr.close()
    return LLMRun(tr, history)


def train_agent(env, model=None, algo: str = "grpo", tokenizer=None, tools=(), run_dir=None,
                callbacks=(), *, env_kwargs: dict | None = None, resume: bool = False,
                progress: bool = False, log=print, **config) -> LLMRun:
    """Train a language model to act in the text environment ``env`` over several turns
    (docs/agents.md); returns an :class:`LLMRun`.

    * ``env``: a text environment's id (``ppokit/GuessNumber-v0``, a registered Gymnasium id
      or ``module:Id``), a factory returning one, or an instance (module
      :mod:`ppokit.llm.agents.env`); ``env_kwargs`` its keyword arguments. A
      ``verifiers`` environment (an instance, or ``verifiers:NAME`` for an installed
      one) plays through its own rollout loop (:mod:`ppokit.llm.agents.verifiers_env`).
    * ``model``: None (the built-in tiny model, warm-started on the environment's
      demonstrations when it has them), a local model directory or a loaded
      ``transformers`` causal LM (with ``tokenizer``).
    * ``tools``: functions the model may call (their schemas from their signatures and
      docstrings: :mod:`ppokit.llm.agents.tools`).
    * ``resume``: continue the run in ``run_dir`` (pass the same ``env`` and ``tools``).
    * ``**config``: any :class:`LLMConfig` key (``iterations``, ``max_turns``,
      ``samples_per_prompt`` — episodes per seed —, ``max_new_tokens`` — one turn's cap —,
      ...).
    """
    from ppokit.errors import require_extra

    require_extra(("transformers", "tokenizers"), "llm", "ppokit.llm.train_agent")
    from ppokit.cliutil import check_callbacks

    from .modeling.models import load_lm, quiet_transformers
    from .training.config_values import config_from_values
    from .training.runfiles import config_from_run

    quiet_transformers()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    callbacks = check_callbacks(callbacks, "(record) -> bool | None")
    tools = list(tools) if isinstance(tools, (list, tuple)) else [tools]
    named = env if isinstance(env, str) else None
    label = named or f"python:{getattr(env, '__name__', type(env).__name__)}"
    values = {"algo": algo, "env": label, "tools": tuple(tools) or None,
              "model": os.fspath(model) if isinstance(model, (str, os.PathLike)) else None,
              "env_kwargs": None if env_kwargs is None else json.dumps(env_kwargs)}
    if resume:
        if run_dir is None:
            raise UsageError("resume: needs run_dir")
        saved = config_from_run(str(run_dir), env=named)  # keys given again, as saved
        cfg = config_from_run(str(run_dir), env=named,
                              **{k: v for k, v in config.items()
                                 if getattr(saved, k, None) != v})
        cfg = replace(cfg, tools=values["tools"] or cfg.tools).resolved()
    else:
        cfg = config_from_values(("train_agent()", values), ("train_agent()", config))
        cfg = cfg.resolved(pretrained=model is not None)
    policy = tok = None
    if isinstance(model, torch.nn.Module):
        if tokenizer is None:
            raise UsageError("tokenizer: a loaded model needs its tokenizer "
                             "(train_agent(env, model, tokenizer=tok))")
        policy, tok = model, _prepare_tokenizer(tokenizer)
    elif model is not None and not resume:
        policy, tok = load_lm(os.fspath(model))
    run = _run(cfg, run_dir, "agent", progress, log, policy=policy, tokenizer=tok,
               resume=resume, callbacks=callbacks, env=None if named is not None else env)
    run._agent = {"env": env, "tools": tools or None}  # what LLMRun.evaluate plays with
    return run


def _prepare_tokenizer(tok):
    if tok.eos_token_id is None:
        raise UsageError("tokenizer: has no EOS token")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


class LLMRun:
    """A finished training run: the trained policy, its reference and its rewards."""

    def __init__(self, trainer, history: list[dict]):
        self._tr = trainer
        self.history = history
        self.run_dir = Path(trainer.run_dir)
        self.config = trainer.cfg
        self._agent: dict | None = None  # an agent run's env and tools (train_agent)

    @property
    def model(self):
        return self._tr.policy

    @property
    def tokenizer(self):
        return self._tr.tok

    @torch.no_grad()
    def generate(self, prompts, *, max_new_tokens: int | None = None,
                 temperature: float = 0.0, seed: int = 0) -> list[str]:
        """Completions of ``prompts`` (a string, a conversation, or a list of either);
        greedy by default."""
        from .inputs.data import render_prompt
        from .modeling.rollout import encode_prompts, generate

        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and all(
                isinstance(m, dict) and "role" in m for m in prompts)):
            prompts = [prompts]  # one prompt (plain, or one conversation)
        texts = [render_prompt(self.tokenizer, p) for p in prompts]
        ids, mask = encode_prompts(self.tokenizer, texts)
        roll = generate(self.model, ids, mask,
                        max_new_tokens=max_new_tokens or self._tr.max_new_tokens,
                        eos_token_id=self.tokenizer.eos_token_id,
                        pad_token_id=self.tokenizer.pad_token_id, temperature=temperature,
                        generator=torch.Generator().manual_seed(seed))
        return [self.tokenizer.decode(r, skip_special_tokens=True) for r in roll.response_ids]

    def evaluate(self, dataset=None, *, temperature: float | None = None,
                 seed: int = 1234) -> dict:
        """Score the trained policy and the reference on ``dataset`` (default: the held-out
        rows) with the run's rewards: ``score_mean``, ``reward/NAME`` and the same with
        ``reference_`` in front, over the same prompts, sampling settings and seed. An
        agent run: its held-out episodes, as ``ppokit llm eval`` plays them
        (docs/agents.md; ``RUN_DIR/eval.json`` written)."""
        from .evaluation.evaluate import evaluate_lm_run, score_policy
        from .inputs.data import load_rows

        if self._agent is not None:
            if dataset is not None:
                raise UsageError("evaluate: an agent run plays its held-out seeds; it takes "
                                 "no dataset")
            return evaluate_lm_run(str(self.run_dir), temperature=temperature, seed=seed,
                                   log=lambda m: None, **self._agent)

        rows = self._tr.eval_rows if dataset is None else load_rows(dataset, "dataset")
        if not rows:
            raise UsageError("evaluate: no held-out rows (eval_fraction=0); pass a dataset")
        temp = self.config.temperature if temperature is None else temperature
        kw = {"max_new_tokens": self._tr.max_new_tokens, "temperature": temp, "seed": seed}
        with self._tr.autocast():  # the number format the run trains in
            pol = score_policy(self.model, self.tokenizer, rows, self._tr.rewards, **kw)
            ref = score_policy(self._tr.reference, self.tokenizer, rows, self._tr.rewards,
                               **kw)
        out = {k: v for k, v in pol.items() if k not in ("samples",)}
        out.update({"reference_" + k: v for k, v in ref.items()
                    if k not in ("samples", "n")})
        out["samples"] = [{"prompt": p, "completion": c} for p, c in pol["samples"]]
        return out

    def save(self, path) -> None:
        """Save the trained policy and tokenizer as a plain local Hugging Face directory."""
        self._tr.export_policy(os.fspath(path))
