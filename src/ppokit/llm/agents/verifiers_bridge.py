"""The bridge between a ``verifiers`` environment's own rollout loop and ppokit's sampler
(:mod:`ppokit.llm.agents.verifiers_env`): the model client ppokit stands in as, and the
batching of its turn requests — a request waits until every unfinished rollout of the
batch waits for the model, then all are answered in one call (:class:`Turns`). The
episode a request comes from travels in a context variable (:data:`EPISODE`), set by each
rollout's task.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
from collections.abc import Callable
from typing import Any

from ppokit.errors import UsageError

__all__ = ["EPISODE", "Turns", "bridge_client", "run_to_completion"]

EPISODE: contextvars.ContextVar[int] = contextvars.ContextVar("ppokit_episode")


def run_to_completion(coro):
    """Run ``coro`` to completion: here, or in a worker thread where this thread already
    runs an event loop (a notebook)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


class Turns:
    """The model turns requested by the rollouts in flight: answered in one batch by
    ``answer(requests) -> results`` (a result that is an exception is raised in its
    rollout) whenever every unfinished rollout waits for one."""

    def __init__(self, n: int, answer: Callable[[list], list]):
        self.unfinished, self.answer = n, answer
        self.waiting: list[tuple[Any, asyncio.Future]] = []
        self.wake = asyncio.Event()

    async def ask(self, request: Any) -> Any:
        fut = asyncio.get_running_loop().create_future()
        self.waiting.append((request, fut))
        self.wake.set()
        return await fut

    def finished(self) -> None:
        self.unfinished -= 1
        self.wake.set()

    async def serve(self) -> None:
        while self.unfinished > 0:
            await self.wake.wait()
            self.wake.clear()
            if not self.waiting or len(self.waiting) < self.unfinished:
                continue
            batch, self.waiting = self.waiting, []
            try:
                results = self.answer([r for r, _ in batch])
            except BaseException as exc:
                for _, fut in batch:
                    fut.cancel()
                raise exc
            for (_, fut), res in zip(batch, results):
                if isinstance(res, BaseException):
                    fut.set_exception(res)
                else:
                    fut.set_result(res)


def _client_class():
    """The bridge class, built on verifiers' ``Client`` when first needed (the package is
    imported only when a verifiers environment is played)."""
    import verifiers as vf

    class Bridge(vf.Client):
        """verifiers' model client, answered by ppokit's sampler (:class:`Turns`)."""

        def __init__(self, turns: Turns):
            super().__init__(None)
            self.turns = turns

        def setup_client(self, config):  # never configured: it holds no connection
            return None

        async def to_native_tool(self, tool):
            return tool

        async def to_native_prompt(self, messages):
            return messages, {}

        async def get_native_response(self, prompt, model, sampling_args, tools=None, **kw):
            raise NotImplementedError  # get_response is answered directly

        async def raise_from_native_response(self, response):
            return None

        async def from_native_response(self, response):
            return response

        async def close(self):
            return None

        async def get_response(self, prompt, model, sampling_args, tools=None, **kwargs):
            msgs = [_message(m) for m in prompt]
            schemas = [{"type": "function", "function": {
                "name": t.name, "description": t.description,
                "parameters": dict(t.parameters)}} for t in (tools or [])]
            return await self.turns.ask((EPISODE.get(), msgs, schemas))

    return Bridge


_BRIDGE: list[type] = []


def bridge_client(turns: Turns):
    """verifiers' client for ``turns`` (the bridge class is made once)."""
    if not _BRIDGE:
        _BRIDGE.append(_client_class())
    return _BRIDGE[0](turns)


def _message(m) -> dict:
    """A verifiers message as ``{"role", "content"}`` (text content only)."""
    role = m.get("role") if isinstance(m, dict) else getattr(m, "role", None)
    content = m.get("content") if isinstance(m, dict) else getattr(m, "content", None)
    if role == "text":
        raise UsageError("env: a verifiers completion (non-chat) environment; ppokit plays "
                         "chat environments (message_type 'chat')")
    if content is None:
        content = ""
    if isinstance(content, list):
        parts = []
        for p in content:
            kind = p.get("type") if isinstance(p, dict) else getattr(p, "type", None)
            if kind != "text":
                raise UsageError(f"env: a verifiers message with {kind} content; ppokit "
                                 "trains text-only models")
            parts.append(p.get("text") if isinstance(p, dict) else p.text)
        content = "".join(parts)
    return {"role": str(role), "content": str(content)}
