"""Rollout engines: what samples the token trainer's completions (``rollout_engine``).

:class:`PpokitEngine` is ppokit's own sampler, the reference; :class:`VllmEngine`
(:mod:`.vllm_engine`, imported only when chosen) is vLLM, fed the policy's weights before
each generation and held to it by a probe (:mod:`.weights`). docs/real_models.md#rollout-
engines says when each is chosen and how to install vLLM."""

from .base import PpokitEngine, RolloutEngine, rollout_from_tokens
from .choose import VLLM_INSTALL, engine_lora, engine_name, make_engine, vllm_installed
from .settings import ENGINES, EngineSettings
from .weights import EngineOutOfSync, served_weights

__all__ = ["RolloutEngine", "PpokitEngine", "rollout_from_tokens", "engine_name",
           "engine_lora", "make_engine", "vllm_installed", "VLLM_INSTALL", "ENGINES",
           "EngineSettings", "EngineOutOfSync", "served_weights"]
