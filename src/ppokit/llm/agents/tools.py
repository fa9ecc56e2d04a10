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
arguments, an exception, a call longer than ``time_limit`` seconds — becomes the text of
the tool's reply for the model to read, never a crash; it counts as a failed call.
"""

from __future__ import annotations

import inspect
import json
import re
import threading
from collections.abc import Callable
from typing import Any

from ppokit.errors import UsageError

__all__ = ["tool_schema", "ToolSet", "CALL", "resolve_tools"]

_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean", list: "array",
          dict: "object"}
CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)


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

    def run(self, name: str | None, args: Any) -> tuple[str, bool]:
        """``(reply text, ok)`` of one call."""
        if name is None:
            return str(args), False
        if name not in self.tools:
            return f"error: unknown tool {name!r}; tools: {', '.join(self.tools)}", False
        fn, _ = self.tools[name]
        try:
            bound = (inspect.signature(fn).bind(*args) if isinstance(args, list)
                     else inspect.signature(fn).bind(**args) if isinstance(args, dict)
                     else None)
        except TypeError as exc:
            return f"error: {name}: {exc}", False
        if bound is None:
            return f"error: {name}: arguments must be an object", False
        out: dict[str, Any] = {}

        def call() -> None:
            try:
                out["value"] = fn(*bound.args, **bound.kwargs)
            except BaseException as exc:  # noqa: BLE001 - the model reads what went wrong
                out["error"] = exc

        # a daemon thread: a call that never returns is left behind, and never keeps the
        # process from ending
        worker = threading.Thread(target=call, name=f"tool-{name}", daemon=True)
        worker.start()
        worker.join(self.time_limit)
        if worker.is_alive():
            return f"error: {name} took longer than {self.time_limit:g} s", False
        if "error" in out:
            exc = out["error"]
            return f"error: {name} raised {type(exc).__name__}: {exc}", False
        return str(out.get("value")), True


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
