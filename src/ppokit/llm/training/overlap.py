"""Generation overlapped with training, with bounded staleness (``max_staleness = K ≥ 1``).

A generation worker (a thread of the trainer's process: torch releases the interpreter
lock inside its operations, and a vLLM engine generates in a process of its own) samples
the batches of later iterations while the trainer trains on this one. The *policy
version* is the number of updates the policy has had; batch ``m`` (the batch iteration
``m + 1`` trains on) is generated with the weights of version ``max(m − K, v0)`` (``v0``:
the version the run started or resumed at), so a batch trained at version ``m`` lags at
most ``K`` versions. The schedule is fixed, so an async run is as reproducible as a
synchronous one:

* at the start, batches ``v0 … v0 + K`` are submitted with the starting weights;
* after each update (version ``v``), the trainer submits batch ``v + K`` with a copy of
  the weights it now has (:meth:`Overlap.after_update`); the worker loads them into a
  copy of the policy it owns (ppokit's sampler) or pushes them into its engine (vLLM)
  before generating that batch.

Each sample carries the version that generated it; a batch whose lag exceeds ``K`` when
its turn comes (which the schedule never lets happen; the check holds it) is dropped and
counted (``stale_dropped``), and the next one taken.

The prompts of batch ``m`` are drawn from the run's prompt stream when it is submitted,
and the worker samples with the run's sampling stream, batch after batch: the streams are
used in the same order as by the synchronous loop. A checkpoint records both streams as
they were *before* the oldest batch not yet trained on, so that a resumed run draws the
same prompts from there; the generations still in flight (the ``K + 1`` batches after the
checkpoint's iteration, done or not) are dropped and generated again, with the resumed
weights.

:meth:`Overlap.close` ends the worker (the trainer's ``close``: at the end of training, on
an exception and after a signal's checkpoint).
"""

from __future__ import annotations

import copy
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from ..modeling.rollout import TokenRollout, encode_prompts

__all__ = ["Overlap", "Batch"]

THREAD_NAME = "ppokit-generation"


@dataclass
class Batch:
    """One submitted batch: its prompts, the version of the weights that generate it, and
    (once :attr:`done`) the rollout or the worker's error."""

    index: int
    version: int
    rows: list
    prompts: list
    py_state: tuple  # the prompt stream before these rows were drawn
    weights: dict | None  # the trained tensors of ``version`` (None: the worker has them)
    done: threading.Event = field(default_factory=threading.Event)
    started: threading.Event = field(default_factory=threading.Event)
    gen_state: torch.Tensor | None = None  # the sampling stream when generation began
    roll: TokenRollout | None = None
    served: dict = field(default_factory=dict)
    error: BaseException | None = None
    seconds: float = 0.0


class _WorkerView:
    """The trainer as an engine sees it from the worker: its ``policy`` is the worker's
    copy (what a weight push reads and the probe compares with)."""

    def __init__(self, tr, model):
        self._tr, self.policy = tr, model

    def __getattr__(self, name):
        return getattr(self._tr, name)


class Overlap:
    """The generation worker of the trainer ``tr`` and its queue of batches."""

    def __init__(self, tr, staleness: int, draw):
        self.tr, self.k, self.draw = tr, int(staleness), draw
        self.model = copy.deepcopy(tr.policy)  # the worker's own weights
        self.model.requires_grad_(False)
        self.view = _WorkerView(tr, self.model)
        self.pending: deque[Batch] = deque()
        self.todo: deque[Batch] = deque()
        self.cond = threading.Condition()
        self.closing = False
        self.next_index = tr.iteration
        self.thread = threading.Thread(target=self._work, name=THREAD_NAME, daemon=True)
        self.thread.start()
        for _ in range(self.k + 1):
            self._submit(tr.iteration, None)

    # ------------------------------------------------------------------ trainer side
    def _submit(self, version: int, weights: dict | None) -> None:
        tr = self.tr
        py_state = tr.py_rng.getstate()
        rows = self.draw()
        b = Batch(self.next_index, version, rows, [tr.prompt_text(r) for r in rows],
                  py_state, weights)
        self.next_index += 1
        self.pending.append(b)
        with self.cond:
            self.todo.append(b)
            self.cond.notify()

    def after_update(self) -> None:
        """The policy has a new version (``tr.iteration``): submit the batch ``K``
        versions ahead with a copy of its trained weights."""
        self._submit(self.tr.iteration, self._current_weights())

    def take(self) -> tuple[Batch, dict]:
        """The next batch to train on (waiting for it) and the statistics of the wait:
        ``stale_dropped`` (samples of batches more than ``K`` versions old, dropped),
        ``staleness_mean`` / ``staleness_max`` (versions its samples lag), the worker's
        ``time_generation`` and ``time_waiting`` (what the trainer waited of it) and
        ``overlap_frac`` (the share of the generation done while the trainer worked)."""
        dropped, waited = 0, 0.0
        while True:
            b = self.pending.popleft()
            t = time.perf_counter()
            self._wait(b.done)
            waited += time.perf_counter() - t
            if b.error is not None:
                raise b.error
            lag = self.tr.iteration - b.version
            if lag <= self.k:
                break
            dropped += len(b.rows)
            self._submit(self.tr.iteration, self._current_weights())
        versions = torch.full((len(b.rows),), b.version, dtype=torch.long)
        lags = self.tr.iteration - versions
        gen = max(b.seconds, 1e-9)
        return b, {"stale_dropped": dropped, "staleness_mean": float(lags.float().mean()),
                   "staleness_max": int(lags.max()), "time_generation": b.seconds,
                   "time_waiting": waited,
                   "overlap_frac": max(0.0, 1.0 - min(waited, gen) / gen), **b.served}

    def _current_weights(self) -> dict:
        """A copy of the policy's trained tensors (with LoRA: the adapters)."""
        return {n: p.detach().clone() for n, p in self.tr.policy.named_parameters()
                if p.requires_grad}

    def streams(self) -> tuple[tuple, torch.Tensor]:
        """The prompt and sampling streams as they were before the oldest batch not yet
        trained on (what a checkpoint records: a resume draws the same prompts)."""
        b = self.pending[0]
        self._wait(b.started)
        return b.py_state, b.gen_state

    def _wait(self, event: threading.Event) -> None:
        while not event.wait(0.5):
            if not self.thread.is_alive():
                raise RuntimeError("the generation worker ended unexpectedly")

    def close(self, timeout: float = 60.0) -> None:
        """End the worker (batches not begun are dropped; one being generated finishes)
        and put the prompt and sampling streams back where they were before the oldest
        batch not trained on, as :meth:`streams` says: training continued later draws
        the same prompts."""
        with self.cond:
            self.closing = True
            self.todo.clear()
            self.cond.notify_all()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout)
        if self.pending and not self.thread.is_alive():
            b = self.pending[0]
            self.tr.py_rng.setstate(b.py_state)
            if b.gen_state is not None:  # (else the stream is where b would begin)
                self.tr.gen.set_state(b.gen_state)
        self.pending.clear()

    # ------------------------------------------------------------------ worker side
    def _work(self) -> None:
        while True:
            with self.cond:
                while not self.todo and not self.closing:
                    self.cond.wait()
                if self.closing:
                    return
                b = self.todo.popleft()
            b.gen_state = self.tr.gen.get_state()
            b.started.set()
            t = time.perf_counter()
            try:
                b.roll, b.served = self._generate(b)
            except BaseException as exc:  # handed to the trainer, raised by take()
                b.error = exc
            b.seconds = time.perf_counter() - t
            b.done.set()

    def _generate(self, b: Batch) -> tuple[TokenRollout, dict]:
        tr, engine = self.tr, self.tr.engine
        if b.weights is not None:
            with torch.no_grad():
                params = dict(self.model.named_parameters())
                for name, t in b.weights.items():
                    params[name].copy_(t)
            b.weights = None  # (the copy is the worker's now)
        served = engine.prepare(self.view)  # an engine with its own copy: the push
        ids, mask = encode_prompts(tr.tok, b.prompts)
        own = getattr(engine, "shares_policy", False)
        with torch.no_grad(), tr.autocast(tr.cfg.sampler_precision):
            roll = engine.generate(
                ids, mask, max_new_tokens=tr.max_new_tokens, eos_token_id=tr.tok.eos_token_id,
                pad_token_id=tr.tok.pad_token_id, temperature=tr.cfg.temperature,
                generator=tr.gen, **({"model": self.model} if own else {}))
        return roll, served
