"""A token trainer's start: its random streams, prompts and rewards (checked before any
model work), the policy (the user's, a local directory, a known model or the built-in
model's warm start), the reference, the critic, LoRA, bf16, FSDP shards, the optimiser,
the KL controller and the divergence guard, and — resuming — the verified checkpoint
loaded before anything changes. Functions of the trainer ``tr``
(:class:`~ppokit.llm.training.trainer.TokenTrainer`)."""

from __future__ import annotations

import json
import os
import random
import signal

import torch

from ppokit.engine.updater import Updater, kl_controller
from ppokit.errors import UsageError
from ppokit.io import (
    MetricsWriter,
    atomic_write_text,
    check_tree,
    find_checkpoint,
    load_checkpoint,
    truncate_metrics,
)
from ppokit.io.checkpoint import no_checkpoint_message

from ..engines import engine_name, make_engine
from ..inputs.reward_setup import check_reward_named_again, reward_set
from ..inputs.task import make_task
from ..modeling.models import (
    AdaptersOff,
    ValueModel,
    build_char_tokenizer,
    build_tiny_model,
    frozen_copy,
    load_lm,
    save_policy,
    wrap_lora,
)
from .config import config_dict, env_kwargs_of
from .divergence import DivergenceGuard, learning_rate_warning
from .progress import recipe_line
from .runfiles import (
    EVAL_PROMPTS,
    TRAIN_PROMPTS,
    UNNAMED,
    prompt_sets,
    run_prompt_sets,
    write_prompts,
)

__all__ = ["setup", "shard_models", "check_prompts", "warm_start", "make_agent"]

AGENT_POSITIONS = 512  # the built-in model's positions in an agent run


def setup(tr, cfg, policy, tokenizer, reference, reward_fn, resume: bool,
          train_rows=None, eval_rows=None, env=None) -> None:
    """Everything a token trainer holds before its first iteration, in order: the
    checkpoint verified (``resume``), the prompts, rewards or agent and the rollout
    engine's name, the models (policy, critic, adapters, reference), the optimiser and
    controllers, then the engine and the run directory's files."""
    ckpt = _verified_checkpoint(tr, cfg, reward_fn) if resume else None
    engine = _inputs(tr, cfg, reward_fn, resume, train_rows, eval_rows, env,
                     builtin=cfg.model is None and policy is None)
    _models(tr, cfg, policy, tokenizer, reference, resume)
    _optimisation(tr, cfg, resume)
    _start(tr, cfg, engine, ckpt, resume, eval_rows)


def _verified_checkpoint(tr, cfg, reward_fn):
    """The checkpoint a resumed run continues from, verified before anything is loaded
    or changed (rank 0 finds it; every rank loads what rank 0 verified)."""
    run_dir = tr.run_dir
    ckpt, damaged, problem = None, [], None
    if tr.is_main:
        ckpt, damaged = find_checkpoint(os.path.join(run_dir, "checkpoints"),
                                        log=tr.log)
        if ckpt is None:
            problem = no_checkpoint_message(run_dir, damaged)
    if tr.dp is not None:  # every rank loads the checkpoint rank 0 verified
        ckpt, problem = tr.dp.gather_objects((ckpt, problem))[0]
    if problem is not None:
        raise UsageError(problem)
    tr._ckpt = load_checkpoint(ckpt)
    tr._damaged = damaged
    check_reward_named_again(cfg, tr._ckpt[2].get("config"), reward_fn)
    return ckpt


def _inputs(tr, cfg, reward_fn, resume, train_rows, eval_rows, env, *, builtin):
    """Seeds, the agent or the task, the rewards and the prompt rows (a bad one fails
    before any model work); returns the rollout engine's name."""
    run_dir = tr.run_dir
    torch.manual_seed(cfg.seed)
    tr.py_rng = random.Random(cfg.seed)  # the prompts: the same on every rank
    # sampling: one stream per rank; shuffling minibatches: the same on every rank
    tr.gen = torch.Generator().manual_seed(cfg.seed + 1_000_003 * tr.rank)
    tr.shuffle_gen = torch.Generator().manual_seed(cfg.seed + 17)
    tr.agent = make_agent(tr, cfg, env)
    tr.task = (make_task(cfg.task, cfg.task_options) if cfg.prompts is None
               and tr.agent is None else None)
    # reward and prompts before any model work: a bad one fails fast
    tr.rewards = None if tr.agent is not None else reward_set(cfg, reward_fn, tr.task,
                                                              log=tr.log)
    if tr.agent is not None:
        tr.train_rows, tr.eval_rows = None, []
    elif resume:
        tr.train_rows, tr.eval_rows = run_prompt_sets(run_dir, cfg)
    elif train_rows is not None:
        from ..inputs.data import split_rows

        tr.train_rows, tr.eval_rows = ((list(train_rows), list(eval_rows))
                                           if eval_rows is not None else
                                           split_rows(list(train_rows), cfg.eval_fraction))
    else:
        tr.train_rows, tr.eval_rows = prompt_sets(cfg)
    # the rollout engine named before any model work (vllm missing: a usage error now)
    engine = engine_name(cfg, world=tr.world, agent=tr.agent is not None,
                         builtin=builtin)
    if cfg.max_staleness and tr.world > 1:
        raise UsageError(f"max_staleness: {cfg.max_staleness} is not offered with several "
                         "ranks (each would generate ahead on its own); use max_staleness=0")
    # generation ahead of training (.overlap): the lead in policy versions (None: generate
    # within the iteration; 0 runs the worker without a lead) and the worker, once started
    tr.staleness, tr.overlap = (cfg.max_staleness or None), None
    if tr.rewards is not None:
        columns = sorted({k for r in (tr.train_rows or [tr.task.row(
            tr.task.heldout_prompts(1)[0])]) for k in r})
        tr.rewards.check_signatures(columns)
    return engine


def _models(tr, cfg, policy, tokenizer, reference, resume) -> None:
    """The policy (the run's reference copy, the named model or a warm start), the
    critic, the adapters, the frozen reference, their precision and sharding."""
    run_dir = tr.run_dir
    ref_dir = os.path.join(run_dir, "reference")
    if policy is None:
        if resume or (tr.is_main and os.path.isdir(ref_dir)):
            check_tree(ref_dir, "run dir")
            policy, tokenizer = load_lm(ref_dir)
        elif cfg.model is not None:
            policy, tokenizer = load_lm(cfg.model)
        else:
            policy, tokenizer = warm_start(tr)
    if tr.is_main and (not os.path.isdir(ref_dir) or os.path.islink(ref_dir)):
        save_policy(policy, tokenizer, ref_dir)
    tr.policy, tr.tok = policy, tokenizer
    if getattr(tr.task, "chat", False) and not getattr(tokenizer, "chat_template", None):
        raise UsageError(f"task: {cfg.task!r} asks its questions through the model's "
                         "chat template, and this tokenizer has none; give --task "
                         "reverse or arithmetic (plain-text prompts) or your own --prompts")
    tr.policy.eval()  # no dropout anywhere: old and new log-probs must agree
    check_prompts(tr, policy, tokenizer)  # (done already before a warm start)
    own_reference = reference is None
    tr.critic = None
    if cfg.use_critic and cfg.critic == "separate":
        tr.critic = ValueModel(tr.policy, separate=True)  # full copy, no adapters
    if cfg.lora_r > 0:
        tr.policy = wrap_lora(tr.policy, cfg.lora_r, cfg.lora_alpha)
        tr.policy.eval()
    # the reference: with LoRA, the policy with its adapters off (the frozen base is
    # the starting policy: no second copy of the weights); else a frozen copy
    if reference is not None:
        tr.reference = reference
    elif cfg.lora_r > 0:
        tr.reference = AdaptersOff(tr.policy)
    else:
        tr.reference = frozen_copy(policy)
    if cfg.use_critic and cfg.critic == "shared":
        tr.critic = ValueModel(tr.policy, separate=False)
    if tr.critic is not None:
        tr.critic.eval()
    if cfg.precision == "bf16":  # attention in float32 on the CPU (llm/modeling/precision.py)
        from ..modeling.precision import use_float32_attention

        for m in (tr.policy, tr.reference, tr.critic):
            if m is not None:
                use_float32_attention(m)
    if tr.dp is not None:  # every rank starts from rank 0's weights
        # the reference too: ranks may have built their starting models differently
        # (a warm start's arithmetic on another machine, an unseeded model)
        tr.dp.broadcast_([p.data for p in tr.trained_parameters()]
                           + [p.data for p in tr.reference.parameters()])
    if cfg.precision == "bf16" and own_reference:  # llm/modeling/precision.py
        from ..modeling.precision import frozen_linears_to_bf16

        frozen_linears_to_bf16(tr.reference)
    tr.fsdp = bool(cfg.fsdp)
    if tr.fsdp:
        shard_models(tr, resume)


def _optimisation(tr, cfg, resume) -> None:
    """The optimiser over the trained parameters, the KL controller and the guard."""
    groups = [{"params": [p for p in tr.policy.parameters() if p.requires_grad],
               "lr": cfg.learning_rate}]
    if tr.critic is not None:
        groups.append({"params": list(tr.critic.parameters()), "lr": cfg.critic_lr})
    # the fused kernel (one pass over each tensor per step) when every parameter is a
    # plain float32 CPU tensor; FSDP's sharded parameters keep the per-tensor loop
    fused = not tr.fsdp and all(p.dtype == torch.float32 and p.device.type == "cpu"
                                  for g in groups for p in g["params"])
    tr.opt = torch.optim.AdamW(groups, weight_decay=0.0, eps=1e-6, fused=fused or None)
    tr.labels_observer = None  # called with each iteration's rollout and labels
    # the update policy (engine/updater.py): the KL controller and the observers; the
    # learning rates are the guard's to change (lr=None), the spec follows beta per update
    tr.updater = Updater(None, lr=None, clip=None,
                         kl=kl_controller(cfg.kl_coef, cfg.kl_target))
    tr.guard = DivergenceGuard(cfg.guard_kl or None, cfg.guard_grad_norm or None,
                                 cfg.guard_retries, log=tr.log)
    warning = learning_rate_warning(cfg.learning_rate, sum(
        p.numel() for p in tr.policy.parameters()), cfg.lora_r > 0)
    if warning and tr.is_main and not resume:
        tr.log(warning)


def _start(tr, cfg, engine, ckpt, resume, eval_rows) -> None:
    """The rollout engine, the start's log lines, then the checkpoint loaded (resume) or
    the run directory's first files written, and the metrics writers."""
    run_dir = tr.run_dir
    ref_dir = os.path.join(run_dir, "reference")
    tr.max_new_tokens = cfg.max_new_tokens or (tr.task.max_new_tokens if tr.task
                                                 else 64)
    tr.engine = make_engine(tr, engine, ref_dir)  # what samples the completions
    if tr.rewards is not None:
        tr.probe_rewards()
    if tr.train_rows is not None and not resume:  # (said once the start has succeeded)
        how = ("eval_prompts" if cfg.eval_prompts or eval_rows is not None
               else f"eval_fraction={cfg.eval_fraction:g}, the last rows")
        tr.log(f"prompts: {len(tr.train_rows)} rows for training, "
                 f"{len(tr.eval_rows)} held out for evaluation ({how})")
    if not resume and tr.is_main:
        tr.log(recipe_line(cfg, tr.max_new_tokens))
    tr.iteration = 0
    tr.elapsed = 0.0
    tr._clock_mark = None  # where the training clock last counted to (trainer.py)
    tr._saved_iteration = None
    if resume:
        tr._load_checkpoint(ckpt)
    elif tr.is_main:
        atomic_write_text(os.path.join(run_dir, "config.json"),
                          json.dumps(config_dict(cfg), indent=2) + "\n")
        if tr.train_rows is not None:  # the run's own copy: resume and eval read it
            write_prompts(os.path.join(run_dir, TRAIN_PROMPTS), tr.train_rows)
            write_prompts(os.path.join(run_dir, EVAL_PROMPTS), tr.eval_rows)
        truncate_metrics(os.path.join(run_dir, "metrics.jsonl"), 0)
        truncate_metrics(os.path.join(run_dir, "samples.jsonl"), 0)
    if not tr.is_main:
        tr.samples = None
        return
    tr.metrics = MetricsWriter(run_dir, tensorboard=True, step_key="iteration")
    tr.samples = MetricsWriter(run_dir, tensorboard=False, name="samples.jsonl",
                                 step_key="iteration")

# ------------------------------------------------------------------ setup
def shard_models(tr, resume: bool) -> None:
    """``fsdp``: the policy, the reference and a separate critic's body sharded across
    the ranks (ppokit/llm/training/fsdp.py); a resumed run's full weights go in first."""
    from .fsdp import shard_model

    if tr.dp is None:
        raise UsageError("fsdp: needs several ranks (torchrun --nproc_per_node N, or "
                         "ppokit llm train --nproc N)")
    if resume:
        tensors = tr._ckpt[0]
        tr.policy.load_state_dict(tensors["policy"])
        if tr.critic is not None:
            tr.critic.load_state_dict(tensors["critic"])
    shard_model(tr.policy)
    shard_model(tr.reference)
    if tr.critic is not None and tr.critic.separate:
        shard_model(tr.critic.body)
    tr.dp.lockstep = True


def check_prompts(tr, policy, tokenizer) -> None:
    """Every prompt row renders (a chat template that raises is named) and fits the
    model's context with the completion; before any training."""
    if tr.train_rows is None or getattr(tr, "_prompts_checked", False):
        return
    from ..inputs.data import check_prompts, model_context

    check_prompts(tokenizer, tr.train_rows, tr.eval_rows, model_context(policy),
                  tr.cfg.max_new_tokens or 64, tr.log)
    tr._prompts_checked = True

def make_agent(tr, cfg, env):
    """The agent run's environment and tools (``env``: the Python API's factory or
    instance, else ``cfg.env`` names it); None without one."""
    if env is None and cfg.env is None:
        return None
    if env is None and cfg.env.startswith(UNNAMED):
        raise UsageError(f"env: this run acts in {cfg.env[len(UNNAMED):]!r}, whose module is "
                         "imported only when you name it: resume with --env "
                         f"{cfg.env[len(UNNAMED):]}")
    if isinstance(cfg.tools, str) and cfg.tools.startswith(UNNAMED):
        raise UsageError(f"tools: this run calls {cfg.tools[len(UNNAMED):]}, imported only "
                         "when you name them: resume with --set tools=... (Python: "
                         "tools=[...])")
    if env is None and cfg.env.startswith("python:"):
        raise UsageError(f"env: this run acts in {cfg.env[7:]!r}, an environment given in "
                         "Python, which a run directory cannot record; pass it again "
                         "(ppokit.llm.train_agent(env, ..., run_dir=RUN_DIR, resume=True))")
    from ..agents.runner import AgentRunner
    from ..agents.tools import resolve_tools
    from ..agents.verifiers_env import VerifiersRunner, is_verifiers_env

    if is_verifiers_env(env if env is not None else cfg.env):
        if cfg.tools is not None:
            raise UsageError("tools: a verifiers environment brings its own tools (a "
                             "ToolEnv's); give them to the environment")
        return VerifiersRunner(env if env is not None else cfg.env, env_kwargs_of(cfg),
                               cfg.tool_format)
    return AgentRunner(env if env is not None else cfg.env, env_kwargs_of(cfg),
                       resolve_tools(cfg.tools), cfg.tool_format, cfg.tool_time_limit)


def warm_start(tr):
    """The built-in model, warm-started; a SIGTERM meanwhile (which ends the start: it is
    undone) is said in a line, since nothing else would tell what was stopped. The tools'
    worker processes the demonstrations used end with it (training starts its own)."""
    try:
        return _warm_start(tr)
    except SystemExit as exc:
        if exc.code == 128 + signal.SIGTERM:
            tr.log("stopped by SIGTERM during the warm start: the run had not started, and "
                   "what it had made is removed")
        raise
    finally:
        if tr.agent is not None:
            tr.agent.close()


def _warm_start(tr):
    from .sft import builtin_sft

    tok = build_char_tokenizer()
    if tr.agent is not None:
        return _agent_warm_start(tr, tok)
    model = build_tiny_model(tok, seed=tr.cfg.seed)
    check_prompts(tr, model, tok)  # before the warm start's work
    # the built-in task's demonstrations (also when the prompts are the user's)
    task = tr.task or make_task(tr.cfg.task)
    steps = tr.cfg.sft_steps or task.sft_steps
    tr.log(f"warm start: SFT of the built-in tiny model ({steps} steps on "
             "noisy demonstrations)")
    info = builtin_sft(task, model, tok, steps=steps, lr=tr.cfg.sft_lr,
                       seed=tr.cfg.seed)
    if tr.is_main:
        atomic_write_text(os.path.join(tr.run_dir, "warm_start.json"),
                      json.dumps(info, indent=2) + "\n")
    return model, tok


def _agent_warm_start(tr, tok):
    """The built-in model for an agent run: more positions (an episode is several turns),
    and SFT on the environment's demonstrations where it has them."""
    from ..agents.runner import warm_start_episodes

    model = build_tiny_model(tok, seed=tr.cfg.seed, max_positions=AGENT_POSITIONS)
    steps = tr.cfg.sft_steps or 300
    try:
        info = warm_start_episodes(tr.agent, model, tok, steps=steps, lr=tr.cfg.sft_lr,
                                   seed=tr.cfg.seed, reserve=tr.cfg.max_new_tokens)
    except AttributeError:
        tr.log(f"warm start: none ({tr.agent.label} has no demonstration(rng)); the built-in "
               "model starts from random weights")
        return model, tok
    tr.log(f"warm start: SFT of the built-in tiny model on {tr.agent.label}'s demonstrations "
           f"({steps} steps)")
    if tr.is_main:
        atomic_write_text(os.path.join(tr.run_dir, "warm_start.json"),
                          json.dumps(info, indent=2) + "\n")
    return model, tok
