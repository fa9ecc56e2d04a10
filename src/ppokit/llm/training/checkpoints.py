"""A token run's checkpoints and its exported policy: what :class:`TokenTrainer` writes each
``checkpoint_every`` iterations (the policy or its LoRA adapters, the critic, the
optimiser, every random stream — with generation ahead of training, as it was before the
batches in flight, which a resume generates again — and the KL controller) through the
run-directory layer every ppokit run uses (:func:`ppokit.io.save_checkpoint`), and how a
resume reads it back and tidies the run directory. Functions of the trainer ``tr``."""

from __future__ import annotations

import copy
import random
from pathlib import Path

import torch

from ppokit.errors import UsageError
from ppokit.io import capture_rng, restore_rng
from ppokit.io import save_checkpoint as write_checkpoint
from ppokit.io.checkpoint import (
    optimizer_from_flat,
    optimizer_to_flat,
)

from ..modeling.models import load_policy_state, save_policy
from .config import config_dict

__all__ = ["export_policy", "policy_state", "save_checkpoint", "load_checkpoint"]


def export_policy(tr, path: str) -> None:
    """Save the policy as a plain local HF directory (LoRA adapters merged in a copy)."""
    model = tr.policy
    if tr.fsdp:  # gathered from the shards on every rank, written by rank 0
        from .fsdp import full_state_dict, plain_copy

        state = full_state_dict(tr.policy)
        if not tr.is_main:
            return
        model = plain_copy(tr.policy, state)
    if not tr.is_main:
        return
    if tr.cfg.lora_r > 0:
        model = copy.deepcopy(tr.policy).merge_and_unload()
    save_policy(model, tr.tok, path)


def policy_state(tr) -> dict:
    """The policy's tensors a checkpoint holds: with LoRA only the adapters (the frozen
    base is the run's ``reference/`` directory, which resume loads first), else all."""
    if tr.cfg.lora_r > 0:
        trained = {n for n, p in tr.policy.named_parameters() if p.requires_grad}
        return {k: v for k, v in tr.policy.state_dict().items() if k in trained}
    return dict(tr.policy.state_dict())


def load_trained_state(tr, state: dict) -> None:
    """The tensors of :func:`policy_state` back into the policy."""
    load_policy_state(tr.policy, state, lora=tr.cfg.lora_r > 0)


def save_checkpoint(tr) -> Path:
    """Write this iteration's checkpoint (once per iteration) with the run-directory
    layer every ppokit run uses (:func:`ppokit.io.save_checkpoint`)."""
    root = Path(tr.run_dir) / "checkpoints"
    ranks = opt_shards = None
    if tr.fsdp:  # full model tensors (a collective), each rank's optimiser shard
        from .fsdp import full_state_dict, local_optimizer_state

        policy_sd = full_state_dict(tr.policy)
        critic_sd = full_state_dict(tr.critic) if tr.critic is not None else None
        opt_shards = tr.dp.gather_to_main(  # only rank 0 holds them all
            optimizer_to_flat(local_optimizer_state(tr.opt)))
    else:
        policy_sd = policy_state(tr)
        critic_sd = dict(tr.critic.state_dict()) if tr.critic is not None else None
    if tr.dp is not None:  # every rank's sampling stream, written by rank 0
        ranks = tr.dp.gather_objects(tr.gen.get_state())
        if not tr.is_main:
            return tr.checkpoint_path(tr.iteration)
    if opt_shards is None:
        opt_t, opt_meta = optimizer_to_flat(tr.opt.state_dict())
    else:
        opt_t = {f"rank{r}/{k}": v for r, (t, _) in enumerate(opt_shards)
                 for k, v in t.items()}
        opt_meta = {"ranks": [m for _, m in opt_shards]}
    gen, prompts = tr.gen, tr.py_rng
    if tr.overlap is not None:  # the streams before the batches in flight (.overlap)
        py_state, gen_state = tr.overlap.streams()
        gen, prompts = torch.Generator(), random.Random()
        gen.set_state(gen_state)
        prompts.setstate(py_state)
    rng_t, rng_meta = capture_rng({"generator": gen, "shuffle": tr.shuffle_gen},
                                  {"prompts": prompts})
    tensors = {"policy": policy_sd, "optimizer": opt_t, "rng": rng_t}
    if ranks is not None:
        tensors["rank_rng"] = {f"rank{r}": st for r, st in enumerate(ranks)}
    if critic_sd is not None:
        tensors["critic"] = critic_sd
    state = {"elapsed": tr.elapsed, "kl_controller": tr.kl_ctl.state_dict(),
             "optimizer": opt_meta, "rng": rng_meta, "config": config_dict(tr.cfg),
             "ranks": tr.world}
    return write_checkpoint(root, tr.iteration, tensors=tensors, arrays={}, state=state)


def load_checkpoint(tr, ckpt: Path) -> None:
    tensors, _, state = tr._ckpt
    del tr._ckpt
    try:
        if tr.fsdp:  # the weights went in before sharding (_shard_models)
            from .fsdp import load_local_optimizer_state

            shards = state["optimizer"].get("ranks") or []
            if len(shards) != tr.world:
                raise ValueError(f"an fsdp run resumes on the same number of ranks "
                                 f"({len(shards)}), not {tr.world}")
            pre = f"rank{tr.rank}/"
            mine = {k[len(pre):]: v for k, v in tensors["optimizer"].items()
                    if k.startswith(pre)}
            load_local_optimizer_state(tr.opt,
                                       optimizer_from_flat(mine, shards[tr.rank]))
        else:
            load_trained_state(tr, tensors["policy"])
            if tr.critic is not None:
                tr.critic.load_state_dict(tensors["critic"])
            tr.opt.load_state_dict(optimizer_from_flat(tensors["optimizer"],
                                                         state["optimizer"]))
            saved_lr = (state.get("config") or {}).get("learning_rate")
            if saved_lr is not None and saved_lr != tr.cfg.learning_rate:
                # --learning-rate given with --resume: the policy's rate from here on
                tr.opt.param_groups[0]["lr"] = tr.cfg.learning_rate
                tr.log(f"learning rate {tr.cfg.learning_rate:g} from here on (the "
                         f"run was started at {saved_lr:g})")
        rng = tensors["rng"]
        restore_rng(rng, state["rng"], {"generator": tr.gen}, {"prompts": tr.py_rng})
        if "gen/shuffle" in rng:  # (checkpoints before data parallelism lack it)
            tr.shuffle_gen.set_state(rng["gen/shuffle"])
        saved_world = int(state.get("ranks", 1))
        if saved_world != tr.world:
            if tr.world > 1 or saved_world > 1:
                tr.log(f"resumed with {tr.world} rank(s); the run was written by "
                         f"{saved_world}: each rank's sampling stream restarts from the "
                         "seed (everything else is restored exactly)")
            if tr.rank:
                tr.gen.manual_seed(tr.cfg.seed + 1_000_003 * tr.rank)
        elif tr.world > 1:
            tr.gen.set_state(tensors["rank_rng"][f"rank{tr.rank}"])
        tr.kl_ctl.load_state_dict(state["kl_controller"])
        tr.iteration = int(state["iteration"])
        tr.elapsed = float(state["elapsed"])
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise UsageError(f"--resume: checkpoint {ckpt} does not fit this run "
                         f"({type(exc).__name__}: {exc}); nothing was changed") from None
    tr._saved_iteration = tr.iteration
    if not tr.is_main:
        return
    tr.tidy_resumed(ckpt, tr._damaged, ("metrics.jsonl", "samples.jsonl"))
    tr.log(f"resumed from {ckpt.name} at iteration {tr.iteration}")
