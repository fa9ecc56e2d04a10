"""vLLM as the rollout engine (``rollout_engine = "vllm"``).

vLLM runs its engine in processes of its own (started by spawn: a script that trains in
Python needs the ``if __name__ == "__main__":`` guard) from the run's ``reference/``
directory, the starting policy as a plain checkpoint. Before each iteration's generation
the policy's current weights are sent to the worker, in the engine's number format, with
no restart and nothing written to disk (:mod:`.vllm_worker`):

* a LoRA policy with ``engine_lora = "adapter"`` (``auto``'s choice on a GPU): its
  adapters alone, built into vLLM's own LoRA adapter from the tensors and served under a
  new adapter id, which every request then names; the base weights stay those the
  engine started with;
* otherwise (a fully fine-tuned policy, or ``engine_lora = "merged"``, ``auto``'s choice
  on a CPU): every weight, LoRA adapters merged per layer, written into a block of
  shared memory that the worker maps, and loaded from there in place by the model's own
  loader.

The prefix cache, whose keys and values the old weights computed, is then emptied, and
the probe (:mod:`.weights`) must pass.

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

import logging
import os
import time
from contextlib import contextmanager

import torch

from ..modeling.rollout import TokenRollout
from .base import RolloutEngine, rollout_from_tokens
from .vllm_worker import OWNER_ENV, SharedWeights, layout, pack, room_for
from .weights import (
    check_probe,
    engine_lora_rank,
    lora_adapter,
    probe_follow,
    probe_gap,
    probe_ids,
    served_weights,
    trainer_probe_logprobs,
)

__all__ = ["VllmEngine", "KV_CACHE_BYTES", "owned_processes"]

KV_CACHE_BYTES = 1 << 30  # on a CPU: the KV cache's memory (vLLM's default asks for most RAM)
DTYPES = {"bf16": ("bfloat16", torch.bfloat16), "fp32": ("float32", torch.float32)}
IN_MEMORY = "ppokit:in-memory"  # the adapter's "path": its tensors arrive by message


# what torchrun tells a rank about its group: not vLLM's business (each rank's engine is
# a single process group of its own)
LAUNCHER_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
                "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE")


@contextmanager
def owned_processes():
    """While vLLM starts its processes (they inherit the environment): ``OWNER_ENV``
    names this process, whose death vLLM's worker watches
    (:func:`.vllm_worker.watch_owner`) and whose direct child, vLLM's engine core, moves
    into a process group of its own so that a terminal's Ctrl-C reaches the trainer alone
    (``ppokit_vllm_plugin``, a vLLM plugin); and a rank's launcher variables are hidden."""
    saved = {k: os.environ.get(k) for k in (OWNER_ENV, *LAUNCHER_ENV)}
    for k in LAUNCHER_ENV:
        os.environ.pop(k, None)
    os.environ[OWNER_ENV] = str(os.getpid())
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def children_in_our_group() -> list[int]:
    """This process's direct children that are vLLM's and still in its process group
    (where a terminal's Ctrl-C reaches them too): none when ``ppokit_vllm_plugin`` ran
    in them. Empty where ``/proc`` cannot be read."""
    me, group, out = os.getpid(), os.getpgid(0), []
    try:
        pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return out
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                head, rest = f.read().rsplit(")", 1)
            fields = rest.split()
            if (int(fields[1]) == me and head.split("(", 1)[1].startswith("VLLM::")
                    and int(fields[2]) == group):
                out.append(pid)
        except (OSError, ValueError, IndexError):
            continue
    return out


class VllmEngine(RolloutEngine):
    """A vLLM ``LLM`` serving the checkpoint ``model_dir`` in ``precision``."""

    name = "vllm"
    trainer_logprobs = False

    def __init__(self, model_dir: str, *, precision: str, seed: int, tokenizer,
                 lora_rank: int = 0, shared_memory: bool = True):
        """``lora_rank > 0``: the policy's updates arrive as a LoRA adapter of that rank
        (:meth:`push`), the base weights staying those of ``model_dir``.
        ``shared_memory``: a full push is written into shared memory that vLLM's worker
        maps (:class:`.vllm_worker.SharedWeights`), else sent by message."""
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # (its INFO: every step)
        from vllm import LLM

        self.precision = precision
        name, self.dtype = DTYPES[precision]
        extra = {} if torch.cuda.is_available() else {"kv_cache_memory_bytes": KV_CACHE_BYTES}
        self.lora_rank, self.adapter_version, self.lora_request = lora_rank, 0, None
        self.shared = SharedWeights() if shared_memory else None
        if lora_rank:
            extra.update(enable_lora=True, max_loras=1, max_cpu_loras=1,
                         max_lora_rank=engine_lora_rank(lora_rank))
            # (its once-per-run advice about adapters that bring their own tokenizer,
            # which ppokit's never do)
            logging.getLogger("vllm.v1.engine.input_processor").addFilter(
                lambda rec: "tokenizers for different LoRAs" not in rec.getMessage())
        t = time.perf_counter()
        with owned_processes():
            self.llm = LLM(model=model_dir, dtype=name, seed=seed, enforce_eager=True,
                           logprobs_mode="processed_logprobs", generation_config="vllm",
                           worker_extension_cls="ppokit.llm.engines.vllm_worker."
                                                "PpokitWorkerExtension", **extra)
        self.start_s = time.perf_counter() - t
        self.shares_our_group = children_in_our_group()
        self.probe = probe_ids(tokenizer)
        self.last_probe = None  # (engine, trainer) log-probs at the last check passed

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
                                 use_tqdm=False, lora_request=self.lora_request)
        tokens, logps = [], []
        for out in outs:
            c = out.outputs[0]
            ids = list(c.token_ids)
            tokens.append(ids)
            logps.append([step[t].logprob for t, step in zip(ids, c.logprobs)])
        return rollout_from_tokens(prompt_ids, prompt_mask, tokens, logps,
                                   eos_token_id=eos_token_id, pad_token_id=pad_token_id)

    def push(self, policy) -> None:
        """Load the policy's current weights into the engine and empty its prefix cache:
        with ``lora_rank``, its adapters alone as a new adapter version (the requests that
        follow name it); else every weight, adapters merged, in place."""
        if self.lora_rank:
            config, named = lora_adapter(policy, self.dtype)
            self.adapter_version += 1
            self.llm.collective_rpc("ppokit_load_lora",
                                    args=(self.adapter_version, config, *pack(named)))
            from vllm.lora.request import LoRARequest

            self.lora_request = LoRARequest(f"ppokit-policy-{self.adapter_version}",
                                            self.adapter_version, IN_MEMORY)
        else:
            named = served_weights(policy, self.dtype)
            if self.shared is not None and room_for(layout(named)[1]):
                self.llm.collective_rpc("ppokit_load_shared", args=self.shared.write(named))
            else:  # (no room in /dev/shm: the bytes go by message)
                self.llm.collective_rpc("ppokit_load_weights", args=pack(named))
        self.llm.reset_prefix_cache()

    def probe_logprobs(self) -> list[float]:
        """The engine's log-probs of the probe's tokens after the first (temperature 1)."""
        from vllm import SamplingParams

        sp = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0,
                            detokenize=False)
        out = self.llm.generate([{"prompt_token_ids": self.probe}], sp, use_tqdm=False,
                                lora_request=self.lora_request)[0]
        return [step[t].logprob for t, step in zip(self.probe[1:], out.prompt_logprobs[1:])]

    def check(self, tr) -> dict:
        """The probe's gap to the trainer ``tr``'s policy and how it followed the trainer
        since the last check that passed (:mod:`.weights`); :class:`EngineOutOfSync`
        when either test fails."""
        engine = torch.tensor(self.probe_logprobs(), dtype=torch.float32)
        trainer = trainer_probe_logprobs(tr, self.probe)
        stats = {**probe_gap(engine, trainer), **probe_follow(self.last_probe, engine, trainer)}
        formats = (self.precision, getattr(getattr(tr, "cfg", None), "precision", "fp32"))
        check_probe(stats, "bf16" if "bf16" in formats else "fp32", self.name)
        self.last_probe = (engine, trainer)
        return stats

    def prepare(self, tr) -> dict:
        t = time.perf_counter()
        self.push(tr.policy)
        t1 = time.perf_counter()
        return {"engine_sync_s": t1 - t, **self.check(tr),
                "engine_probe_s": time.perf_counter() - t1}

    def close(self) -> None:
        shared, self.shared = getattr(self, "shared", None), None
        if shared is not None:
            shared.close()
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None and hasattr(llm, "llm_engine"):
            engine = llm.llm_engine
            shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
            if callable(shutdown):
                shutdown()
