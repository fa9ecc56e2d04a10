"""The rollout engine's settings: a section of the token trainer's configuration
(:class:`ppokit.llm.training.config.LLMConfig` inherits it), kept here with the engines
it chooses among."""

from __future__ import annotations

from dataclasses import dataclass

from ppokit.settings import setting

__all__ = ["ENGINES", "ENGINE_LORA", "EngineSettings"]

ENGINES = ("auto", "ppokit", "vllm")
ENGINE_LORA = ("auto", "adapter", "merged")


@dataclass(frozen=True)
class EngineSettings:
    """What samples an iteration's completions (docs/real_models.md#rollout-engines)."""

    rollout_engine: str = setting("auto", "what samples the completions: ppokit (its own "
                                  "sampler, the reference) | vllm (vLLM in a process of its "
                                  "own, the policy's weights pushed into it before each "
                                  "generation and checked by a probe; the old log-probs are "
                                  "then always the trainer's own, recomputed) | auto (vllm "
                                  "when it is installed, the run can use it and the machine "
                                  "has a GPU or AVX-512, else ppokit)",
                                  choices=ENGINES)
    engine_lora: str = setting("auto", "how an engine with its own copy of the weights "
                               "(vllm) receives a LoRA policy's update: adapter (the adapters "
                               "alone, served as the engine's LoRA adapter; the base is never "
                               "sent again) | merged (every weight, adapters merged in, "
                               "loaded in place) | auto (adapter on a GPU; merged on a CPU, "
                               "where vLLM's adapter layers made generation 2.7x slower "
                               "than the push they save)", choices=ENGINE_LORA)
