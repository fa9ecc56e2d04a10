"""Tools: plain Python functions the model may call during an episode.

A tool's JSON schema comes from its signature and docstring (:func:`tool_schema`): the
name, the docstring's first paragraph as the description, each parameter's type from its
annotation (``int`` integer, ``float`` number, ``str`` string, ``bool`` boolean, ``list``
array, ``dict`` object) and its description from an ``Args:`` section. The schemas are
offered to the model through the chat template's ``tools`` argument where the tokenizer's
template takes one.

A call is found in the model's turn in one of two formats:

* **json** (any tokenizer): ``<tool_call>{"name": "calculate", "arguments": {"expression":
  "3*7"}}</tool_call>`` — the format of the Hermes / Qwen chat templates;
* **compact** (the built-in model, whose characters have no braces or quotes): a turn that
  is ``NAME:ARGS`` for a known tool ``NAME``, the arguments split at ``,`` and given in
  the order of the signature.

Whatever goes wrong — JSON that does not parse, an unknown tool, missing or extra
arguments, an exception (``SystemExit`` included), a result of ``None`` or one whose
``str()`` raises, a tool that ends its process, a call longer than ``time_limit`` seconds
— becomes the text of the tool's reply for the model to read, never a crash; it counts as
a failed call (:class:`ToolReply` says which way it failed). ppokit's own tools run in the
trainer's process; a user's run in worker processes the trainer can kill
(:mod:`.toolworker`). A reply is at most the caller's limit of characters (the episode's
room: :mod:`.bounds`), the rest replaced by the marker ``…[cut: N chars]``.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ppokit.errors import UsageError

from .toolworker import ToolWorkers, call_tool

__all__ = ["tool_schema", "ToolSet", "ToolReply", "CALL", "REPLY_CHARS", "resolve_tools"]

_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean", list: "array",
          dict: "object"}
CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)
REPLY_CHARS = 4096  # a reply's characters when the caller gives no limit


def _arg_docs(doc: str) -> dict[str, str]:
    out, inside = {}, False
    for line in doc.splitlines():
        s = line.strip()
        if s.lower() in ("args:", "arguments:", "parameters:"):
            inside = True
            continue
        if inside:
            m = re.match(r"(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)", s)
            if m:
                out[m.group(1)] = m.group(2)
            elif not s:
                break
    return out


def tool_schema(fn: Callable) -> dict:
    """The JSON schema of ``fn`` in the chat templates' ``tools`` form (module doc)."""
    if not callable(fn) or not getattr(fn, "__name__", "").isidentifier():
        raise UsageError(f"tools: expected a named function, got {fn!r}")
    doc = inspect.getdoc(fn) or ""
    args = _arg_docs(doc)
    props, required = {}, []
    for name, p in inspect.signature(fn).parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        ann = p.annotation if p.annotation is not inspect.Parameter.empty else str
        if isinstance(ann, str):  # postponed annotations
            ann = {"int": int, "float": float, "str": str, "bool": bool, "list": list,
                   "dict": dict}.get(ann, str)
        props[name] = {"type": _TYPES.get(ann, "string")}
        if name in args:
            props[name]["description"] = args[name]
        if p.default is inspect.Parameter.empty:
            required.append(name)
    description = doc.split("\n\n")[0].replace("\n", " ").strip()
    return {"type": "function", "function": {
        "name": fn.__name__, "description": description,
        "parameters": {"type": "object", "properties": props, "required": required}}}


@dataclass
class ToolReply:
    """One call's reply: ``body`` what the tool said (or what went wrong), ``status``
    ``ok``, ``failed`` (no call made: bad JSON, an unknown tool, wrong arguments),
    ``error`` (the tool raised, returned nothing showable or ended its process) or
    ``timeout``; ``rest`` how many ``unit`` (chars or bytes) of the reply were left out."""

    body: str
    status: str = "ok"
    rest: int = 0
    unit: str = "chars"

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def cut(self) -> bool:
        return self.rest > 0

    def shown(self, keep: int | None = None) -> str:
        """The text the model reads: the body's first ``keep`` characters, and when
        anything was left out the marker ``…[cut: N chars]``."""
        keep = len(self.body) if keep is None else max(0, min(keep, len(self.body)))
        chars = len(self.body) - keep + (self.rest if self.unit == "chars" else 0)
        parts = [f"{chars} chars"] if chars else []
        if self.unit != "chars" and self.rest:
            parts.append(f"{self.rest} {self.unit}")
        return self.body[:keep] + (f"…[cut: {' + '.join(parts)}]" if parts else "")


def _in_process(fn: Callable) -> bool:
    """ppokit's own tools (safe, quick) run in the trainer's process; a user's in a
    worker (:mod:`.toolworker`)."""
    from .env import calc

    return fn is calc


class ToolSet:
    """The tools of a run: find calls in a model's turn and run them (module doc)."""

    def __init__(self, tools: list[Callable], fmt: str = "json", time_limit: float = 5.0):
        if fmt not in ("json", "compact"):
            raise UsageError(f"tool_format: expected json or compact, got {fmt!r}")
        self.tools = {}
        for fn in tools:
            schema = tool_schema(fn)
            self.tools[schema["function"]["name"]] = (fn, schema)
        self.fmt, self.time_limit = fmt, float(time_limit)
        self._workers = None  # forked at the first call of a user's tool

    @property
    def schemas(self) -> list[dict]:
        return [schema for _, schema in self.tools.values()]

    def calls(self, text: str) -> list[tuple[str, Any]]:
        """``[(name or None, arguments or error text)]`` of the calls in ``text``."""
        if self.fmt == "compact":
            name, sep, rest = text.strip().partition(":")
            if sep and name in self.tools:
                return [(name, [a for a in rest.split(",")] if rest else [])]
            return []
        out = []
        for body in CALL.findall(text):
            try:
                call = json.loads(body.strip())
            except (ValueError, RecursionError) as exc:
                out.append((None, f"error: the tool call is not valid JSON ({exc})"))
                continue
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                out.append((None, 'error: a tool call is {"name": ..., "arguments": {...}}'))
                continue
            out.append((call["name"], call.get("arguments", {})))
        return out

    def _bind(self, name: str | None, args: Any):
        """The bound arguments of a call, or the :class:`ToolReply` saying why not."""
        if name is None:
            return ToolReply(str(args)[:REPLY_CHARS], "failed")
        if name not in self.tools:
            return ToolReply(f"error: unknown tool {name[:100]!r}; tools: "
                             f"{', '.join(self.tools)}", "failed")
        sig = inspect.signature(self.tools[name][0])
        try:
            bound = (sig.bind(*args) if isinstance(args, list)
                     else sig.bind(**args) if isinstance(args, dict) else None)
        except TypeError as exc:
            return ToolReply(f"error: {name}: {exc}", "failed")
        if bound is None:
            return ToolReply(f"error: {name}: arguments must be an object", "failed")
        return bound

    def answer(self, calls: list[tuple[str | None, Any]],
               limits: int | list[int] = REPLY_CHARS) -> list[ToolReply]:
        """The replies to ``calls`` (as :meth:`calls` finds them), each at most its
        ``limits`` characters of the tool's text: ppokit's own tools called here, the
        user's in the worker processes (:mod:`.toolworker`) within :attr:`time_limit`
        seconds, several at a time."""
        if isinstance(limits, int):
            limits = [limits] * len(calls)
        out: list[ToolReply | None] = []
        jobs, where = [], []
        for (name, args), limit in zip(calls, limits):
            limit = max(0, int(limit))
            bound = self._bind(name, args)
            if isinstance(bound, ToolReply):
                out.append(bound)
                continue
            fn = self.tools[name][0]
            if _in_process(fn):
                out.append(self._reply(name, call_tool(fn, bound.args, bound.kwargs, limit,
                                                     Exception)))
                continue
            out.append(None)
            jobs.append((name, tuple(bound.args), dict(bound.kwargs), limit))
            where.append((len(out) - 1, name))
        if jobs:
            if self._workers is None:
                self._workers = ToolWorkers({n: fn for n, (fn, _) in self.tools.items()})
            for (k, name), res in zip(where, self._workers.run(jobs, self.time_limit)):
                out[k] = self._reply(name, res)
        return out

    @staticmethod
    def _reply(name: str, res: tuple[str, str, int, str]) -> ToolReply:
        status, body, rest, unit = res
        if status == "ok":
            return ToolReply(body, "ok", rest, unit)
        return ToolReply(f"error: {name} {body}", status)

    def run(self, name: str | None, args: Any, limit: int = REPLY_CHARS) -> tuple[str, bool]:
        """``(reply text, ok)`` of one call (:meth:`answer`)."""
        reply = self.answer([(name, args)], limit)[0]
        return reply.shown(), reply.ok

    def close(self) -> None:
        """End the worker processes (a later call starts new ones)."""
        if self._workers is not None:
            self._workers.close()
            self._workers = None


def resolve_tools(tools) -> list[Callable]:
    """The tool functions ``tools`` names: ``module:function`` entries (comma-separated
    text, or a list; imported because the user names them) and callables as they are."""
    if tools is None:
        return []
    entries = [t.strip() for t in tools.split(",")] if isinstance(tools, str) else list(tools)
    from ..inputs.rewards import load_reward_callable

    for t in entries:
        if isinstance(t, str) and t.startswith("python:"):
            raise UsageError(f"tools: {t[7:]!r} was given in Python, which a run directory "
                             "cannot record; pass the function again (tools=[...])")
    return [t if callable(t) else load_reward_callable(t, "tools") for t in entries if t]
