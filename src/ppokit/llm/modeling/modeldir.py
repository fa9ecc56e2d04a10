"""What a model directory must hold before ppokit loads anything from it.

* **Weights in safetensors only.** A directory whose weights are only pickles
  (``pytorch_model.bin``, ``*.pt``, ``*.pth``, ``*.ckpt``) is refused in one line: loading
  a pickle can run code, and ppokit does not rely on a library's default to prevent it.
  The loaders are also told to read safetensors only (``use_safetensors=True``).
* **A tokenizer.** A directory saved without its tokenizer is named as such (rather than
  reported through the loader's own error).
* **A configuration of a bounded size.** ``config.json`` must be a regular file of at most
  :data:`MAX_MODEL_CONFIG` bytes (a model's is a few KB); a larger one, or a FIFO or a
  device in its place, is refused in one line naming it and its size, before any loader
  reads it whole.
"""

from __future__ import annotations

import os

from ppokit.errors import UsageError

__all__ = ["check_weights", "check_tokenizer_files", "check_model_config", "PICKLE_SUFFIXES",
           "TOKENIZER_FILES", "MAX_MODEL_CONFIG"]

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt",
                   "tokenizer.model", "spiece.model", "sentencepiece.bpe.model")


MAX_MODEL_CONFIG = 4 * 2**20


def _names(path: str) -> set[str]:
    try:
        return set(os.listdir(path))
    except OSError as exc:
        raise UsageError(f"{path}: cannot list the model directory ({exc.strerror})") from None


def check_weights(path: str, what: str = "--model") -> None:
    """Refuse a model directory whose weights are pickles only (no ``*.safetensors``)."""
    names = _names(path)
    if any(n.endswith(".safetensors") for n in names):
        return
    pickles = sorted(n for n in names if n.endswith(PICKLE_SUFFIXES))
    if pickles:
        raise UsageError(f"{what}: {path!r} holds its weights only as pickles ({pickles[0]}); "
                         "ppokit loads safetensors weights only (loading a pickle can run "
                         "code): save the model with save_pretrained(dir, "
                         "safe_serialization=True)")


def check_tokenizer_files(path: str, what: str = "--model") -> None:
    """Refuse a model directory saved without its tokenizer."""
    if not _names(path) & set(TOKENIZER_FILES):
        raise UsageError(f"{what}: {path!r} holds no tokenizer (none of "
                         f"{', '.join(TOKENIZER_FILES[:4])}, ...); save the tokenizer with "
                         f"the model: tokenizer.save_pretrained({path!r})")


def check_model_config(path: str, what: str = "--model") -> None:
    """Refuse a ``config.json`` that is not a regular file of at most
    :data:`MAX_MODEL_CONFIG` bytes (a missing one is the loader's to report)."""
    from ppokit.io.atomic import check_named_file

    cfg = os.path.join(path, "config.json")
    if os.path.lexists(cfg):
        check_named_file(cfg, what, MAX_MODEL_CONFIG, "model configuration (config.json)")
