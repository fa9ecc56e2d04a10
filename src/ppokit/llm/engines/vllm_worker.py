"""Runs inside vLLM's worker process (vLLM imports it by name: ``worker_extension_cls``):
the methods the trainer calls there through ``LLM.collective_rpc``. Nothing here imports
the rest of ppokit.

vLLM's messages carry plain values (a tensor among untyped arguments would arrive as its
encoding, not as a tensor), so the weights travel as :func:`pack`'s raw bytes, names,
number formats and shapes, and :func:`unpack` rebuilds them without a copy."""

from __future__ import annotations

import warnings

import torch

__all__ = ["PpokitWorkerExtension", "pack", "unpack"]


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


class PpokitWorkerExtension:
    """Mixed into vLLM's worker class, so ``self`` is the worker."""

    def ppokit_load_weights(self, names, dtypes, shapes, blobs) -> int:
        """Load :func:`pack`'s weights, in checkpoint format, into the served model in
        place: vLLM's own reload (the model's loader fuses q/k/v and gate/up projections
        and the platform repacks them for its kernels, as at start-up); the number of
        tensors sent."""
        self.reload_weights(weights_iterator=iter(unpack(names, dtypes, shapes, blobs)),
                            is_checkpoint_format=True)
        retie_output_head(self.model_runner.model)
        return len(names)


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
