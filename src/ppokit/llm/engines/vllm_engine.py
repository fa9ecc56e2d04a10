"""vLLM as the rollout engine (``rollout_engine = "vllm"``).

vLLM runs its engine in processes of its own (started by spawn: a script that trains in
Python needs the ``if __name__ == "__main__":`` guard) from the run's ``reference/``
directory, the starting policy as a plain checkpoint. Before each iteration's generation
the policy's current weights — LoRA adapters merged per layer, in the engine's number
format — are sent to the worker and loaded in place by the model's own loader
(:mod:`.vllm_worker`): no restart, nothing written to disk. The prefix cache, whose keys
and values the old weights computed, is then emptied, and the probe
(:mod:`.weights`) must pass.

Sampling: ``softmax(logits / temperature)`` with no top-k, top-p or min-p and the
model's own generation defaults ignored, each row with a seed drawn from the trainer's
generator (a run is reproducible on one machine); the log-probs returned are those of
the processed distribution (after the temperature), as ppokit's sampler gives.

vLLM's processes end with the run: :meth:`VllmEngine.close` shuts them down (vLLM sends
its engine core SIGTERM, and SIGKILL after 5 s); a worker that outlives the trainer
(killed, so that no ``close()`` ran) kills its engine core and itself within about a
second (:func:`owned_processes`, :func:`.vllm_worker.watch_owner`).
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager

import torch

from ..modeling.rollout import TokenRollout
from .base import RolloutEngine, rollout_from_tokens
from .vllm_worker import OWNER_ENV, pack
from .weights import check_probe, probe_gap, probe_ids, served_weights, trainer_probe_logprobs

__all__ = ["VllmEngine", "KV_CACHE_BYTES", "owned_processes"]

KV_CACHE_BYTES = 1 << 30  # on a CPU: the KV cache's memory (vLLM's default asks for most RAM)
DTYPES = {"bf16": ("bfloat16", torch.bfloat16), "fp32": ("float32", torch.float32)}


@contextmanager
def owned_processes():
    """While vLLM starts its processes (they inherit it): ``OWNER_ENV`` names this
    process, whose death vLLM's worker watches (:func:`.vllm_worker.watch_owner`)."""
    before = os.environ.get(OWNER_ENV)
    os.environ[OWNER_ENV] = str(os.getpid())
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(OWNER_ENV, None)
        else:
            os.environ[OWNER_ENV] = before


class VllmEngine(RolloutEngine):
    """A vLLM ``LLM`` serving the checkpoint ``model_dir`` in ``precision``."""

    name = "vllm"
    trainer_logprobs = False

    def __init__(self, model_dir: str, *, precision: str, seed: int, tokenizer):
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # (its INFO: every step)
        from vllm import LLM

        self.precision = precision
        name, self.dtype = DTYPES[precision]
        extra = {} if torch.cuda.is_available() else {"kv_cache_memory_bytes": KV_CACHE_BYTES}
        t = time.perf_counter()
        with owned_processes():
            self.llm = LLM(model=model_dir, dtype=name, seed=seed, enforce_eager=True,
                           logprobs_mode="processed_logprobs", generation_config="vllm",
                           worker_extension_cls="ppokit.llm.engines.vllm_worker."
                                                "PpokitWorkerExtension", **extra)
        self.start_s = time.perf_counter() - t
        self.probe = probe_ids(tokenizer)

    def generate(self, prompt_ids, prompt_mask, *, max_new_tokens, eos_token_id, pad_token_id,
                 temperature, generator=None, model=None) -> TokenRollout:
        if model is not None:
            raise ValueError("the vllm engine samples the policy it serves, no other model")
        from vllm import SamplingParams

        rows = [ids[m.bool()].tolist() for ids, m in zip(prompt_ids, prompt_mask)]
        seeds = torch.randint(0, 2**31 - 1, (len(rows),), generator=generator).tolist()
        params = [SamplingParams(temperature=temperature, top_p=1.0, top_k=0, min_p=0.0,
                                 max_tokens=max_new_tokens, logprobs=0, seed=s,
                                 stop_token_ids=[eos_token_id], detokenize=False)
                  for s in seeds]
        outs = self.llm.generate([{"prompt_token_ids": r} for r in rows], params,
                                 use_tqdm=False)
        tokens, logps = [], []
        for out in outs:
            c = out.outputs[0]
            ids = list(c.token_ids)
            tokens.append(ids)
            logps.append([step[t].logprob for t, step in zip(ids, c.logprobs)])
        return rollout_from_tokens(prompt_ids, prompt_mask, tokens, logps,
                                   eos_token_id=eos_token_id, pad_token_id=pad_token_id)

    def push(self, policy) -> None:
        """Load the policy's current weights into the engine and empty its prefix cache."""
        self.llm.collective_rpc("ppokit_load_weights",
                                args=pack(served_weights(policy, self.dtype)))
        self.llm.reset_prefix_cache()

    def probe_logprobs(self) -> list[float]:
        """The engine's log-probs of the probe's tokens after the first (temperature 1)."""
        from vllm import SamplingParams

        sp = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0,
                            detokenize=False)
        out = self.llm.generate([{"prompt_token_ids": self.probe}], sp, use_tqdm=False)[0]
        return [step[t].logprob for t, step in zip(self.probe[1:], out.prompt_logprobs[1:])]

    def check(self, tr) -> dict:
        """The probe's gap to the trainer ``tr``'s policy; :class:`EngineOutOfSync` beyond
        the tolerance."""
        stats = probe_gap(self.probe_logprobs(), trainer_probe_logprobs(tr, self.probe))
        formats = (self.precision, getattr(getattr(tr, "cfg", None), "precision", "fp32"))
        check_probe(stats, "bf16" if "bf16" in formats else "fp32", self.name)
        return stats

    def prepare(self, tr) -> dict:
        t = time.perf_counter()
        self.push(tr.policy)
        t1 = time.perf_counter()
        return {"engine_sync_s": t1 - t, **self.check(tr),
                "engine_probe_s": time.perf_counter() - t1}

    def close(self) -> None:
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None and hasattr(llm, "llm_engine"):
            engine = llm.llm_engine
            shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
            if callable(shutdown):
                shutdown()
