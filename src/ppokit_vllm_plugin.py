"""ppokit's vLLM general plugin (entry point ``vllm.general_plugins``): vLLM runs it in
each of its processes as they start. It acts only in the first process a ppokit trainer starts
for vLLM, its engine core (the direct child of the trainer named in
``PPOKIT_VLLM_OWNER``), and anywhere else — any other program that uses vLLM where
ppokit is installed — does nothing.

What it does: it moves the engine core into a process group of its own, which the worker
the engine core then starts inherits. A terminal's Ctrl-C is sent to every process of
the foreground process group; without this, vLLM's processes, which shut down on SIGINT,
would end in the middle of the trainer's iteration, and the trainer, which on SIGINT
finishes its iteration and writes a checkpoint, could not. vLLM's processes still end
with the trainer: it shuts them down (SIGTERM, by pid), and if it is killed the worker's
watch ends them (``ppokit.llm.engines.vllm_worker.watch_owner``).

A module of its own, outside the ``ppokit`` package, which it does not import: vLLM loads
it in every process of every program that uses vLLM where ppokit is installed, and
importing ppokit there would cost seconds."""

from __future__ import annotations

import os

OWNER_ENV = "PPOKIT_VLLM_OWNER"  # (ppokit.llm.engines.vllm_worker.OWNER_ENV)

__all__ = ["register", "started_by_trainer"]


def started_by_trainer() -> bool:
    """This process was started directly by the trainer named in ``PPOKIT_VLLM_OWNER``
    (not the trainer itself, nor one further down)."""
    owner = os.environ.get(OWNER_ENV, "")
    return owner.isdigit() and os.getpid() != int(owner) and os.getppid() == int(owner)


def register() -> None:
    if not started_by_trainer():
        return
    try:
        os.setpgid(0, 0)
    except OSError:  # (a session leader cannot move: nothing to do)
        pass
