"""Runs inside vLLM's worker process (vLLM imports it by name: ``worker_extension_cls``):
the methods the trainer calls there through ``LLM.collective_rpc``. Nothing here imports
the rest of ppokit.

vLLM's messages carry plain values (a tensor among untyped arguments would arrive as its
encoding, not as a tensor). A full push of the weights is written by the trainer into a
block of shared memory (:class:`SharedWeights`), and the message carries only the block's
name and where each tensor lies in it (:func:`layout`); the worker maps the block and
loads from views of it (:func:`views`). Without room in ``/dev/shm``, and for a LoRA
adapter (a few megabytes), the bytes travel in the message itself: :func:`pack`'s raw
bytes, names, number formats and shapes, rebuilt by :func:`unpack` without a copy.

Imported in a worker that the trainer whose pid is in ``PPOKIT_VLLM_OWNER`` started
(through vLLM's engine-core process), it watches that trainer (:func:`watch_owner`): vLLM
notices the death of the engine core in its workers, not the death of the process that
started the engine core, which blocks on its input socket for ever. When the trainer is
gone (killed: no ``close()`` ran), the worker kills the processes between itself and the
trainer, then itself."""

from __future__ import annotations

import json
import logging
import mmap
import os
import signal
import threading
import time
import warnings

import torch

__all__ = ["PpokitWorkerExtension", "pack", "unpack", "SharedWeights", "layout", "views",
           "watch_owner", "OWNER_ENV"]

OWNER_ENV = "PPOKIT_VLLM_OWNER"  # the pid of the trainer that starts vLLM's processes
WATCH_PERIOD_S = 1.0


def pack(named: list) -> tuple[list, list, list, list]:
    """``[(name, tensor)]`` as ``(names, dtypes, shapes, blobs)`` of plain values."""
    names, dtypes, shapes, blobs = [], [], [], []
    for name, t in named:
        t = t.detach().contiguous().cpu()
        names.append(name)
        dtypes.append(str(t.dtype).removeprefix("torch."))
        shapes.append(list(t.shape))
        blobs.append(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return names, dtypes, shapes, blobs


def unpack(names, dtypes, shapes, blobs) -> list:
    """:func:`pack`'s values back as ``[(name, tensor)]`` (read-only views of the bytes)."""
    out = []
    with warnings.catch_warnings():  # the buffers are read, never written
        warnings.filterwarnings("ignore", message=".*not writable.*")
        for name, dtype, shape, blob in zip(names, dtypes, shapes, blobs):
            raw = torch.frombuffer(memoryview(blob), dtype=torch.uint8)
            out.append((name, raw.view(getattr(torch, dtype)).reshape(shape)))
    return out


# ---------------------------------------------------------------- shared memory
ALIGN = 64  # each tensor's offset in the block, in bytes


def layout(named: list) -> tuple[list, int]:
    """``[(name, dtype, shape, offset, nbytes)]`` of ``[(name, tensor)]`` laid out in
    one block, and the block's size."""
    out, end = [], 0
    for name, t in named:
        start = -(-end // ALIGN) * ALIGN
        nbytes = t.numel() * t.element_size()
        out.append((name, str(t.dtype).removeprefix("torch."), list(t.shape), start, nbytes))
        end = start + nbytes
    return out, max(end, 1)


def extent(plan: list) -> int:
    """The bytes a :func:`layout` plan spans."""
    return max((start + nbytes for _, _, _, start, nbytes in plan), default=1)


def room_for(nbytes: int, where: str = "/dev/shm") -> bool:
    """Whether the shared-memory file system has ``nbytes`` free (a block larger than
    it would be created, then fault on the first write beyond)."""
    try:
        st = os.statvfs(where)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize >= nbytes + (64 << 20)


class SharedWeights:
    """The trainer's half: one block of POSIX shared memory (``/dev/shm``: memory, not
    disk) that each push writes the weights into, reused while it is large enough; the
    worker maps the same block and loads from it (:meth:`PpokitWorkerExtension.
    ppokit_load_shared`), so a push's bytes cross no socket. Removed by :meth:`close`
    (and, should the trainer be killed, by Python's resource tracker)."""

    def __init__(self):
        self.block = None

    def write(self, named: list) -> tuple[str, list]:
        """Copy ``[(name, tensor)]`` into the block: ``(block name, layout)``."""
        from multiprocessing import shared_memory

        plan, size = layout(named)
        if self.block is None or self.block.size < size:
            self.close()
            self.block = shared_memory.SharedMemory(create=True, size=size)
        view = torch.frombuffer(self.block.buf, dtype=torch.uint8, count=size)
        for (_, _, _, start, nbytes), (_, t) in zip(plan, named):
            view[start:start + nbytes].copy_(t.detach().contiguous().reshape(-1)
                                              .view(torch.uint8))
        del view
        return self.block.name, plan

    def close(self) -> None:
        block, self.block = self.block, None
        if block is not None:
            block.close()
            block.unlink()


_ATTACHED: dict = {}  # the worker's half: the trainer's blocks it has mapped, by name


def attached(name: str, size: int) -> mmap.mmap:
    """The trainer's shared block ``name`` (at least ``size`` bytes), mapped once; the
    mapping of an older block is let go. Opened by name, outside Python's resource
    tracking: the block is the trainer's, which removes it."""
    import _posixshmem  # (what multiprocessing.shared_memory opens blocks with)

    if name not in _ATTACHED:
        for old in list(_ATTACHED):
            try:
                _ATTACHED.pop(old).close()
            except BufferError:  # (a view of it is still alive: unmapped when it goes)
                pass
        fd = _posixshmem.shm_open("/" + name.lstrip("/"), os.O_RDWR, mode=0o600)
        try:
            _ATTACHED[name] = mmap.mmap(fd, size)
        finally:
            os.close(fd)
    return _ATTACHED[name]


def views(block, plan: list) -> list:
    """``[(name, tensor)]``: the tensors of ``plan`` as views of ``block``'s memory."""
    base = torch.frombuffer(block, dtype=torch.uint8, count=extent(plan))
    return [(name, base[start:start + nbytes].view(getattr(torch, dtype)).reshape(shape))
            for name, dtype, shape, start, nbytes in plan]


class PpokitWorkerExtension:
    """Mixed into vLLM's worker class, so ``self`` is the worker."""

    def ppokit_load_weights(self, names, dtypes, shapes, blobs) -> int:
        """Load :func:`pack`'s weights, in checkpoint format, into the served model in
        place: vLLM's own reload (the model's loader fuses q/k/v and gate/up projections
        and the platform repacks them for its kernels, as at start-up); the number of
        tensors sent."""
        quiet_expected_reload_warnings()
        self.reload_weights(weights_iterator=iter(unpack(names, dtypes, shapes, blobs)),
                            is_checkpoint_format=True)
        retie_output_head(self.model_runner.model)
        return len(names)

    def ppokit_load_shared(self, block_name, plan) -> int:
        """:meth:`ppokit_load_weights` from the trainer's shared block (:class:`SharedWeights`)
        instead of bytes sent by message; the number of tensors."""
        quiet_expected_reload_warnings()
        named = views(attached(block_name, extent(plan)), plan)
        self.reload_weights(weights_iterator=iter(named), is_checkpoint_format=True)
        del named
        retie_output_head(self.model_runner.model)
        return len(plan)

    def ppokit_load_lora(self, adapter_id, config_json, names, dtypes, shapes, blobs) -> int:
        """Serve :func:`pack`'s LoRA tensors (peft's names, ``...lora_A.weight``) with the
        peft configuration ``config_json`` as the adapter ``adapter_id``, in place of any
        other: built from the tensors by vLLM's own ``LoRAModel.from_lora_tensors``, as its
        loader builds an adapter read from a directory, with nothing on disk. The base
        weights are untouched. The number of tensors sent."""
        from vllm.lora.peft_helper import PEFTHelper

        manager = self.model_runner.lora_manager
        models = manager._adapter_manager
        config = dict(json.loads(config_json),
                      vllm_max_position_embeddings=manager.max_position_embeddings)
        helper = PEFTHelper.from_dict(config)
        helper.validate_legal(manager.lora_config)
        model = models.model
        mapper = getattr(model, "hf_to_vllm_mapper", None)
        tensors = {n: t.clone() for n, t in unpack(names, dtypes, shapes, blobs)}
        lora = manager._lora_model_cls.from_lora_tensors(
            adapter_id, tensors, helper, device="cpu", dtype=manager.lora_config.lora_dtype,
            model_vocab_size=manager.vocab_size,
            weights_mapper=None if mapper is None else mapper.get_rename_mapper(),
            skip_prefixes=getattr(model, "lora_skip_prefixes", None))
        for old in list(models.list_adapters()):
            models.remove_adapter(old)
        models.add_adapter(lora)
        models.activate_adapter(lora.id)
        return len(names)


# layers a reload in checkpoint format never finds weights for, each push: the rotary
# embedding (its tables are computed, not stored) and a tied output head (it shares the
# embedding's tensor, which :func:`retie_output_head` prepares again)
NOT_IN_A_CHECKPOINT = ("RotaryEmbedding", "ParallelLMHead")


def _expected(record) -> bool:
    return not (record.getMessage().endswith(": Failed to load weights")
                and str(record.args and record.args[0]) in NOT_IN_A_CHECKPOINT)


def quiet_expected_reload_warnings() -> None:
    """vLLM's reload warns of every layer it found no weights for; for the layers of
    :data:`NOT_IN_A_CHECKPOINT` that is expected, and said no more (once per process)."""
    log = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    if _expected not in log.filters:
        log.addFilter(_expected)


def retie_output_head(model) -> None:
    """A model whose output head shares the input embedding: the reload writes the
    embedding's tensor and prepares the embedding layer for its kernel, not the head,
    which on a CPU multiplies by the kernel's packed copy of the old weights. The head is
    tied to the embedding's tensor again and prepared anew."""
    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", None)
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if not tied or head is None or embed is None:
        return
    if head.weight is not embed.weight:
        head.weight = embed.weight
    method = getattr(head, "quant_method", None)
    if callable(getattr(method, "process_weights_after_loading", None)):
        method.process_weights_after_loading(head)


def parent_of(pid: int) -> int | None:
    """The parent's pid of the process ``pid`` (None: it is gone)."""
    if pid == os.getpid():
        return os.getppid()
    try:
        with open(f"/proc/{pid}/stat") as f:  # "pid (comm) state ppid ..."
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        pass
    try:  # (no /proc: vLLM brings psutil)
        import psutil

        return psutil.Process(pid).ppid()
    except Exception:
        return None


def ancestry(n: int) -> list[int]:
    """This process and up to ``n - 1`` of its ancestors (this one first; init excluded)."""
    up = [os.getpid()]
    while len(up) < n and (p := parent_of(up[-1])) is not None and p > 1:
        up.append(p)
    return up


def chain_to(owner: int, depth: int = 4) -> list[int] | None:
    """This process and its ancestors below ``owner`` (this one first), or None when
    ``owner`` is not among the first ``depth`` ancestors (or is this process)."""
    up = ancestry(depth + 1)
    return up[:up.index(owner)] if owner in up[1:] else None


def watch_owner(owner: int, period: float = WATCH_PERIOD_S) -> threading.Thread | None:
    """A daemon thread that, once the process ``owner`` is no longer the parent of the
    topmost of :func:`chain_to` (it died: its orphans are handed to another), kills those
    processes (SIGKILL, the topmost first, each only while it is still an ancestor of
    this one) and ends this one. None where ``owner`` is not an ancestor."""
    chain = chain_to(owner)
    if chain is None:
        return None

    def watch() -> None:
        while parent_of(chain[-1]) == owner:
            time.sleep(period)
        up = ancestry(len(chain))  # (a pid still among them is the process recorded)
        for pid in reversed(chain[1:]):
            if pid in up:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        os._exit(1)

    t = threading.Thread(target=watch, name="ppokit-owner-watch", daemon=True)
    t.start()
    return t


def _watch_from_env() -> None:
    owner = os.environ.get(OWNER_ENV, "")
    if owner.isdigit() and int(owner) != os.getpid():
        watch_owner(int(owner))


_watch_from_env()
