"""What evaluating a finished run loads from its directory: its newest intact checkpoint
(:func:`run_checkpoint`), its configuration resolved (:func:`resolved_for_eval`) and the
trained and reference models (:func:`eval_models`); shared by a prompt run's evaluation
(:mod:`.evaluate`) and an agent run's (:mod:`.agent_eval`)."""

from __future__ import annotations

import os

from ppokit.errors import UsageError

__all__ = ["run_checkpoint", "resolved_for_eval", "eval_models"]


def run_checkpoint(run_dir: str, log=print):
    """``(path, tensors, state)`` of the run's newest intact checkpoint."""
    from ppokit.io import find_checkpoint, load_checkpoint
    from ppokit.io.checkpoint import no_checkpoint_message

    ckpt, damaged = find_checkpoint(os.path.join(run_dir, "checkpoints"), log=log)
    if ckpt is None:
        raise UsageError(no_checkpoint_message(run_dir, damaged))
    return (ckpt, *load_checkpoint(ckpt)[::2])


def resolved_for_eval(cfg):
    """The configuration resolved; evaluating needs no loss or estimator of the user's."""
    from ppokit.plugins import reading_run

    with reading_run():
        return cfg.resolved()


def eval_models(run_dir: str, rcfg, tensors: dict, ckpt):
    """``(policy, reference, tokenizer)``: the run's reference (its starting policy, from
    ``reference/``) and the checkpoint's policy (LoRA merged), both in eval mode."""
    import copy

    from ppokit.io import check_tree

    from ..modeling.models import load_lm, load_policy_state, wrap_lora

    ref_dir = os.path.join(run_dir, "reference")
    if not os.path.isdir(ref_dir) or os.path.islink(ref_dir):
        raise UsageError(f"eval: {run_dir!r} has no reference/ directory")
    check_tree(ref_dir, "run dir")
    reference, tok = load_lm(ref_dir)
    reference.eval()
    policy = copy.deepcopy(reference)
    if rcfg.lora_r > 0:
        policy = wrap_lora(policy, rcfg.lora_r, rcfg.lora_alpha)
    try:
        load_policy_state(policy, tensors["policy"], lora=rcfg.lora_r > 0)
    except (KeyError, RuntimeError, ValueError) as exc:
        raise UsageError(f"eval: checkpoint {ckpt} does not fit the run's reference "
                         f"model ({type(exc).__name__})") from None
    if rcfg.lora_r > 0:
        policy = policy.merge_and_unload()
    policy.eval()
    return policy, reference, tok
