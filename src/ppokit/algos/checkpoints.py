"""An environment run's checkpoints: what :class:`~ppokit.algos.trainer.Trainer` writes (the
policy, the optimiser, every random stream, the collector's and normalisers' state, the
environments' state where it can be saved, the KL controller) through the run-directory
layer every ppokit run uses (:func:`ppokit.io.save_checkpoint`), and how a resume reads it
back, including ``best/``'s evaluation. Functions of the trainer ``tr``."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ppokit.envs import env_state, load_env_state
from ppokit.envs.multiagent import groups_data, state_space_of
from ppokit.errors import UsageError
from ppokit.io.checkpoint import (
    capture_rng,
    find_checkpoint,
    load_checkpoint,
    no_checkpoint_message,
    optimizer_from_flat,
    optimizer_to_flat,
    restore_rng,
    save_checkpoint,
)
from ppokit.io.spaces import recorded_spaces

from .runs import BEST_DIR

__all__ = ["write", "resume", "best_of_best_dir"]


def write(tr, root: str | Path | None, keep: int | None) -> Path:
    opt_t, opt_meta = optimizer_to_flat(tr.opt.state_dict())
    rng_t, rng_meta = capture_rng({"sample": tr.sample_gen,
                                   "shuffle": tr.shuffle_gen})
    tensors = {"model": dict(tr.policy.state_dict()), "optimizer": opt_t, "rng": rng_t}
    arrays = {"collector": tr.collector.state_dict()}
    if tr.obs_norm is not None:
        arrays["obs_norm"] = tr.obs_norm.state_dict()
    if tr.reward_scaler is not None:
        arrays["reward_scaler"] = tr.reward_scaler.state_dict()
    state = {
        "global_step": tr.global_step,
        "elapsed": tr.elapsed,
        "last_return": tr.last_return,
        "recent_returns": list(tr.recent_returns),
        "best_eval_return": tr.best_eval_return,
        "optimizer": opt_meta,
        "rng": rng_meta,
        "kl_controller": tr.kl_ctl.state_dict() if tr.kl_ctl is not None else None,
        "env_state": env_state(tr.env),
        # the spaces the policy was built for: loading needs no environment
        "spaces": recorded_spaces(tr.env.single_observation_space,
                                  tr.env.single_action_space,
                                  state_space_of(tr.env) if tr.cfg.centralised_critic
                                  else None),
        # with agent_groups: each group's name, agents and own spaces (the policy rebuilds
        # from "spaces" alone, whose last observation entry counts the groups)
        "agent_groups": groups_data(tr.env),
        "config": tr.cfg.to_dict(),
        "selfplay": sp.state_dict() if (sp := getattr(tr, "selfplay", None)) else None,
    }
    root = tr.run_dir / "checkpoints" if root is None else Path(root)
    return save_checkpoint(root, tr.iteration, tensors=tensors, arrays=arrays,
                           state=state, keep=keep or tr.cfg.keep_checkpoints)



def resume(tr) -> None:
    root = tr.run_dir / "checkpoints"
    ckpt, damaged = find_checkpoint(root, log=tr.log)
    if ckpt is None:
        raise UsageError(no_checkpoint_message(tr.run_dir, damaged))
    tensors, arrays, st = load_checkpoint(ckpt)
    try:
        iteration, step = int(st["iteration"]), int(st["global_step"])
        if iteration < 1 or step != iteration * tr.cfg.rollout_size:
            raise ValueError("iteration and global_step disagree with the config")
        tr.policy.load_state_dict(tensors["model"])
        tr.opt.load_state_dict(optimizer_from_flat(tensors["optimizer"],
                                                     st["optimizer"]))
        restore_rng(tensors["rng"], st["rng"], {"sample": tr.sample_gen,
                                                "shuffle": tr.shuffle_gen})
        if tr.obs_norm is not None:
            tr.obs_norm.load_state_dict(arrays["obs_norm"])
        if tr.reward_scaler is not None:
            tr.reward_scaler.load_state_dict(arrays["reward_scaler"])
        if getattr(tr, "selfplay", None) is not None:  # the pool at this checkpoint
            tr.selfplay.load_state_dict(st["selfplay"])
        if tr.kl_ctl is not None and st["kl_controller"] is not None:
            tr.kl_ctl.load_state_dict(st["kl_controller"])
        tr.iteration, tr.global_step = iteration, step
        tr.elapsed = float(st["elapsed"])
        tr.last_return = st["last_return"]
        recent = st.get("recent_returns", [])  # absent in older checkpoints
        if not isinstance(recent, list) or not all(
                isinstance(x, (int, float)) and not isinstance(x, bool) for x in recent):
            raise ValueError("recent_returns is not a list of numbers")
        tr.recent_returns.extend(float(x) for x in recent)
        best = st.get("best_eval_return")
        if best is not None and (isinstance(best, bool)
                                 or not isinstance(best, (int, float))):
            raise ValueError("best_eval_return is not a number")
        tr.best_eval_return = None if best is None else float(best)
        best_of_best_dir(tr)
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise UsageError(f"--resume: checkpoint {ckpt} does not fit this run "
                         f"({type(exc).__name__}: {exc}); nothing was changed") from None
    tr.tidy_resumed(ckpt, damaged)
    if st["env_state"] is not None:
        tr.env.reset(seed=tr.cfg.seed)  # then overwritten by the saved state
        load_env_state(tr.env, st["env_state"])
        tr.collector.load_state_dict(arrays["collector"])
        tr.log(f"resumed from {ckpt.name} (iteration {tr.iteration}, "
                 f"step {tr.global_step}); environment state restored")
    else:  # fresh episodes: a reset, as at the start of a run
        tr.collector.reset(seed=tr.cfg.seed + 7919 * tr.iteration)
        if tr.reward_scaler is not None:
            tr.reward_scaler.ret[:] = 0.0
        why = (f"{tr.cfg.env_id}'s state cannot be saved" if tr.cfg.vectorization
               != "ray" else "the environments live in Ray actors (not checkpointed)")
        tr.log(f"resumed from {ckpt.name} (iteration {tr.iteration}, "
                 f"step {tr.global_step}); {why}, so the environments were reset and "
                 "the episodes in progress are lost")


def best_of_best_dir(tr) -> None:
    """After a resume: ``best/`` may hold a policy evaluated after the checkpoint resumed
    from (the run was stopped between the two); its recorded evaluation counts, so that
    only a better policy replaces it."""
    root = tr.run_dir / BEST_DIR
    if not root.is_dir():
        return
    ckpt, _ = find_checkpoint(root)
    if ckpt is None:
        return
    best = load_checkpoint(ckpt)[2].get("best_eval_return")
    if isinstance(best, (int, float)) and not isinstance(best, bool) and np.isfinite(best) \
            and (tr.best_eval_return is None or best > tr.best_eval_return):
        tr.best_eval_return = float(best)
