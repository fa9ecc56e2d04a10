"""``verifiers`` environments, played by ppokit's sampler and trained by the same engine.

A ``verifiers`` environment (the package's 0.1–0.3 API: ``SingleTurnEnv``,
``MultiTurnEnv``, ``ToolEnv`` and the classes built on them, with their datasets and
rubrics) runs its own rollout loop: ``rollout(input, client, model)`` asks a ``Client``
for each model turn and calls the environment's ``env_response`` in between, and the
rubric scores the finished rollouts of a group. ppokit runs that loop unchanged, every
rollout of an iteration at once in one event loop, and stands in as the client: a turn
request waits until every unfinished rollout waits for the model, and then all of them
are sampled in one batch (:class:`~ppokit.llm.agents.verifiers_bridge.Turns`).

The tokens are ppokit's, not a re-rendering of the messages verifiers keeps: each
rollout's first request is rendered as the prompt (the chat template, with the
environment's tools); every later request is the conversation so far, the model's turn,
and the environment's new messages, and only those new messages are rendered, as the
chat template's difference after the turn exactly as it was sampled
(:class:`~ppokit.llm.agents.conversation.Renderer`). An environment that rewrites earlier
messages is refused (ppokit trains one growing sequence per episode).

Tool calls. The model's text is read in ``tool_format``: json (``<tool_call>{"name": ...,
"arguments": {...}}</tool_call>``, the Hermes / Qwen chat templates' format) or compact
(``NAME:ARGS``, arguments in the order of the tool's parameters); the calls go back to
verifiers as the response's ``tool_calls`` (and leave its ``content``), where its
``ToolEnv`` runs them and turns their errors into tool messages.

Rewards and ends. The rubric's score is the episode's return, on the last turn's last
token. A rollout that ends by its own rules (the environment's stop conditions, its
``max_turns``) is terminated; one that ppokit cuts — at ``max_turns`` model turns or when
the next turn would not fit the model's context: the request is answered with verifiers'
``OverlongPromptError``, which ends the rollout cleanly — is truncated (its return
bootstraps from the critic, as any cut episode's). A rollout that fails (verifiers
records an error in its state) keeps the rubric's score and is counted in
``episode/error_frac``; an exception out of the environment's code stops the run with an
error that names it.

Seeds and data: an episode's seed picks its dataset row (``seed % len(dataset)``);
held-out evaluation plays the rows of ``eval_dataset`` (the training rows where the
environment has none). Episodes from one seed are one rubric group (a critic-free
preset's group).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from ppokit.errors import UsageError, UserCodeError, require_extra

from .conversation import Episode, Renderer, pad_left
from .runner import EVAL_SEED_OFFSET, AgentRunner
from .tools import CALL
from .verifiers_bridge import EPISODE, Turns, bridge_client, run_to_completion

__all__ = ["VerifiersRunner", "is_verifiers_env", "load_verifiers_env", "PREFIX"]

PREFIX = "verifiers:"


def is_verifiers_env(env: Any) -> bool:
    """``env`` names a verifiers environment (``verifiers:NAME``) or is one."""
    if isinstance(env, str):
        return env.strip().startswith(PREFIX)
    return any(c.__name__ == "Environment" and c.__module__.startswith("verifiers.")
               for c in type(env).__mro__)


def load_verifiers_env(env: Any, env_kwargs: dict) -> tuple[Any, str]:
    """``(environment, label)``: ``verifiers:NAME`` loaded with verifiers'
    ``load_environment(NAME, **env_kwargs)`` (the installed environment module ``NAME``,
    or one in the current directory, imported because the user names it; what it raises is
    one line, :func:`ppokit.plugins.user_code`), or the instance given."""
    require_extra(("verifiers",), "verifiers", "a verifiers environment")
    import verifiers as vf

    if not all(hasattr(vf, n) for n in ("MultiTurnEnv", "Client", "Response")):
        raise UsageError(f"env: verifiers {getattr(vf, '__version__', '?')} is installed; "
                         "ppokit plays the environments of verifiers 0.1.14 to 0.3 "
                         "(SingleTurnEnv, MultiTurnEnv, ToolEnv): pip install "
                         "'ppokit[verifiers]'")
    if isinstance(env, str):
        name = env.strip()[len(PREFIX):]
        if not name:
            raise UsageError("env: expected verifiers:NAME, the name of an installed "
                             "verifiers environment")
        import importlib.util

        from ppokit.plugins import search_cwd, user_code

        module = name.replace("-", "_")  # verifiers' module name of an environment id
        search_cwd()  # the current directory first, as for every module of the user's
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise UsageError(f"env: cannot load the verifiers environment {name!r}: no "
                             f"module {module!r} is installed (install the environment's "
                             "package first, e.g. with pip)")
        with _own_signals(), user_code(f"env {env}", "load_environment"):
            loaded = vf.load_environment(name, **env_kwargs)
        env, label = loaded, env.strip()
    else:
        if env_kwargs:
            raise UsageError("env_kwargs: apply to verifiers:NAME; a verifiers environment "
                             "given as an instance is used as it is")
        label = type(env).__name__
    if not isinstance(env, vf.Environment):
        raise UsageError(f"env: {label} is not a verifiers Environment "
                         f"(got {type(env).__name__})")
    return env, label


@contextlib.contextmanager
def _own_signals():
    """Keep this process's SIGINT and SIGTERM handlers: a verifiers environment installs
    its own when it is built (a SIGTERM handler that exits at once), which would take a
    run's checkpoint on SIGTERM away from it; the environment's teardown still runs at
    exit."""
    import signal

    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        if threading.current_thread() is threading.main_thread():
            for s, h in saved.items():
                if h is not None:
                    signal.signal(s, h)


class VerifiersRunner(AgentRunner):
    """An agent run whose episodes are a verifiers environment's rollouts (module doc)."""

    def __init__(self, env: Any, env_kwargs: dict, tool_format: str):
        self.env, self.label = load_verifiers_env(env, env_kwargs)
        self.tools = None
        self.tool_format = tool_format
        self.pool = []
        try:
            self.train_rows = self.env.get_dataset()
        except ValueError:
            raise UsageError(f"env: the verifiers environment {self.label} has no dataset "
                             "to train on") from None
        if len(self.train_rows) == 0:
            raise UsageError(f"env: the verifiers environment {self.label}'s dataset is "
                             "empty")
        self.env.build_eval_dataset()
        self.eval_rows = self.env.eval_dataset if self.env.eval_dataset is not None \
            and len(self.env.eval_dataset) else self.train_rows
        self.factory = None
        self.failures: list[str] = []

    def renderer(self, tok) -> Renderer:
        return Renderer(tok)

    def row(self, seed: int) -> dict:
        """The dataset row of an episode's seed (module doc)."""
        if seed >= EVAL_SEED_OFFSET:
            rows, k = self.eval_rows, seed - EVAL_SEED_OFFSET
        else:
            rows, k = self.train_rows, seed
        return dict(rows[k % len(rows)])

    def play(self, tr, seeds: list[int], generator: torch.Generator | None = None,
             temperature: float | None = None) -> list[Episode]:
        from ..inputs.data import model_context

        context = model_context(tr.policy)[0] or 4096
        game = _Game(self, tr.tok, seeds, max_turns=tr.cfg.max_turns,
                     max_new_tokens=tr.max_new_tokens, context=context,
                     sample=lambda ids, mask: tr.sample_ids(ids, mask, generator, temperature))
        with torch.no_grad(), tr.autocast(tr.cfg.sampler_precision):
            eps = run_to_completion(game.play())
        if game.errors:
            tr.log(f"env {self.label}: {len(game.errors)} of {len(eps)} rollouts failed "
                   f"(verifiers recorded an error; the rubric's score kept); the first: "
                   f"{game.errors[0]}")
        self.failures = game.errors
        return eps

    def stats(self, eps: list[Episode]) -> dict:
        out = super().stats(eps)
        out["episode/error_frac"] = len(self.failures) / max(len(eps), 1)
        for name in sorted({k for ep in eps for k in ep.info.get("metrics", {})}):
            vals = [ep.info["metrics"][name] for ep in eps if name in ep.info.get("metrics", {})]
            vals = [float(v) for v in vals if isinstance(v, (int, float))]
            if vals:
                out[f"rubric/{name}"] = sum(vals) / len(vals)
        return out


class _Game:
    """One batch of rollouts of a verifiers environment (module doc)."""

    def __init__(self, runner: VerifiersRunner, tok, seeds: list[int], *, max_turns: int,
                 max_new_tokens: int, context: int,
                 sample: Callable[[torch.Tensor, torch.Tensor], Any]):
        self.runner, self.env, self.tok, self.seeds = runner, runner.env, tok, seeds
        self.max_turns, self.max_new_tokens, self.context = max_turns, max_new_tokens, context
        self.sample = sample
        self.eps: list[Episode | None] = [None] * len(seeds)
        self.seen = [0] * len(seeds)          # messages of verifiers' conversation read
        self.last = [("", True)] * len(seeds)  # each episode's last turn: text, ended
        self.renderers: dict[tuple, Renderer] = {}
        self.tool_names: list[set] = [set()] * len(seeds)
        self.errors: list[str] = []

    async def play(self) -> list[Episode]:
        import verifiers as vf

        turns = Turns(len(self.seeds), self.answer)
        bridge = bridge_client(turns)
        states: list[Any] = [None] * len(self.seeds)

        async def one(k: int) -> None:
            EPISODE.set(k)
            try:
                states[k] = await self.env.rollout(self.runner.row(self.seeds[k]), bridge,
                                                   "ppokit", {})
            finally:
                turns.finished()

        async def group(idx: list[int]) -> None:
            await asyncio.gather(*(one(k) for k in idx))
            group_states = [states[k] for k in idx]
            await self.env.rubric.score_group(group_states)
            for s in group_states:
                await self.env.rubric.cleanup(s)

        groups: dict[int, list[int]] = {}
        for k, s in enumerate(self.seeds):
            groups.setdefault(s, []).append(k)
        try:
            await asyncio.gather(turns.serve(), *(group(i) for i in groups.values()))
        except (UsageError, UserCodeError):
            raise
        except vf.Error as exc:
            raise UserCodeError(f"env {self.runner.label}: {type(exc).__name__}: {exc}") \
                from exc
        except Exception as exc:
            raise UserCodeError(f"env {self.runner.label}: a rollout raised "
                                f"{type(exc).__name__}: {exc}") from exc
        return [self.finish(k, s) for k, s in enumerate(states)]

    def finish(self, k: int, state) -> Episode:
        ep = self.eps[k]
        err = state.get("error")
        if ep is None or not ep.turn_ends:
            raise UserCodeError(f"env {self.runner.label}: a rollout ended before the model's "
                                f"first turn (error: {err!r})")
        if err is not None:
            self.errors.append(f"{type(err).__name__}: {err}")
        reward = state.get("reward")
        reward = 0.0 if reward is None else reward
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) \
                or not math.isfinite(float(reward)):
            raise UserCodeError(f"env {self.runner.label}: the rubric's reward is "
                                f"{reward!r}; expected a finite number")
        ep.rewards = [0.0] * (ep.turns - 1) + [float(reward)]
        ep.done, ep.terminated = True, not ep.truncated
        metrics = state.get("metrics") or {}
        ep.info = {"metrics": dict(metrics) if isinstance(metrics, dict) else {}}
        return ep

    # -- the model's turns ------------------------------------------------------------

    def answer(self, requests: list[tuple[int, list, list]]) -> list:
        import verifiers as vf

        results: list[Any] = [None] * len(requests)
        todo = []
        for j, (k, msgs, tools) in enumerate(requests):
            ctx = self.context_of(k, msgs, tools)
            if ctx is None:
                self.eps[k].truncated = True
                results[j] = vf.OverlongPromptError(
                    "ppokit: the episode reached max_turns or the model's context")
            else:
                todo.append((j, k))
        if todo:
            ids, mask = pad_left([self.eps[k].ids for _, k in todo], self.tok.pad_token_id)
            roll = self.sample(ids, mask)
            width = ids.shape[1]
            for row, (j, k) in enumerate(todo):
                am = roll.action_mask[row, width:]
                toks = roll.input_ids[row, width:][am].tolist()
                logp = roll.logp[row, width:][am].tolist()
                ep = self.eps[k]
                ep.add(toks, action=True, logp=logp)
                ep.turn_ends.append(len(ep.ids) - 1)
                text = self.tok.decode(toks, skip_special_tokens=True)
                cut = bool(roll.truncated[row])
                self.last[k] = (text, not cut)
                results[j] = self.response(k, text, cut, len(ep.ids), len(toks))
        return results

    def context_of(self, k: int, msgs: list[dict], tools: list[dict]) -> list[int] | None:
        """Extend episode ``k`` with the messages verifiers added since its last turn;
        None where ppokit cuts the episode here (module doc)."""
        label = self.runner.label
        key = tuple(t["function"]["name"] for t in tools)
        if key not in self.renderers:
            self.renderers[key] = Renderer(self.tok, tools or None)
        renderer = self.renderers[key]
        ep = self.eps[k]
        if ep is None:
            ep = self.eps[k] = Episode(seed=self.seeds[k], messages=list(msgs))
            ep.add(renderer.prompt(msgs), action=False)
            ep.prompt_len = len(ep.ids)
            self.tool_names[k] = set(key)
        else:
            n = self.seen[k]
            if len(msgs) <= n or msgs[n]["role"] != "assistant" or [
                    (m["role"], m["content"]) for m in msgs[:n]] != [
                    (m["role"], m["content"]) for m in ep.messages[:n]]:
                raise UsageError(f"env {label}: the conversation verifiers sent for a turn "
                                 "is not the previous one followed by the model's turn; ppokit "
                                 "trains environments whose conversation only grows")
            text, ended = self.last[k]
            new = msgs[n + 1:]
            if ep.turns >= self.max_turns:
                return None
            seg = renderer.reply(ep.messages, text, new, ended=ended)
            if len(ep.ids) + len(seg) + self.max_new_tokens > self.context:
                return None
            ep.messages += [{"role": "assistant", "content": text}, *new]
            ep.add(seg, action=False)
        self.seen[k] = len(msgs)
        if ep.turns >= self.max_turns or len(ep.ids) + self.max_new_tokens > self.context:
            return None
        return ep.ids

    def response(self, k: int, text: str, cut: bool, total: int, n: int):
        import verifiers as vf

        calls = self.tool_calls(k, text) if self.tool_names[k] else []
        content = text
        if calls and self.runner.tool_format == "json":
            content = CALL.sub("", text).strip()
        ep = self.eps[k]
        ep.tool_calls += len(calls)
        ep.tool_failures += sum(not self._fits(k, c) for c in calls)
        finish = "tool_calls" if calls else "length" if cut else "stop"
        return vf.Response(
            id=f"ppokit-{k}-{ep.turns}", created=int(time.time()), model="ppokit",
            usage=vf.Usage(prompt_tokens=total - n, reasoning_tokens=0,
                           completion_tokens=n, total_tokens=total),
            message=vf.ResponseMessage(content=content, tool_calls=calls or None,
                                       finish_reason=finish, is_truncated=cut))

    def tool_calls(self, k: int, text: str) -> list:
        """The calls in the model's turn, in ``tool_format`` (module doc)."""
        import verifiers as vf

        turn = self.eps[k].turns
        if self.runner.tool_format == "compact":
            name, sep, rest = text.strip().partition(":")
            if not (sep and name in self.tool_names[k]):
                return []
            params = self._params(k, name)
            values = rest.split(",") if rest else []
            args = dict(zip(params, values)) if len(values) <= len(params) else \
                {"_": values}
            return [vf.ToolCall(id=f"call-{turn}-0", name=name, arguments=json.dumps(args))]
        out = []
        for i, body in enumerate(CALL.findall(text)):
            try:
                call = json.loads(body.strip())
            except (ValueError, RecursionError):
                call = None
            if isinstance(call, dict) and isinstance(call.get("name"), str):
                args = call.get("arguments", {})
                args = args if isinstance(args, str) else json.dumps(args)
                out.append(vf.ToolCall(id=f"call-{turn}-{i}", name=call["name"],
                                       arguments=args))
            else:  # verifiers' ToolEnv answers it with the parse error
                out.append(vf.ToolCall(id=f"call-{turn}-{i}", name=_name_in(body),
                                       arguments=body.strip()))
        return out

    def _schema(self, name: str) -> dict:
        for r in self.renderers.values():
            for t in r.tools or []:
                if t["function"]["name"] == name:
                    return t["function"].get("parameters") or {}
        return {}

    def _params(self, k: int, name: str) -> list[str]:
        return list(self._schema(name).get("properties", {}))

    def _fits(self, k: int, call) -> bool:
        """A call of a tool of the episode with arguments that fit its schema's names (what
        ppokit counts as a good call; the tool itself may still fail in verifiers)."""
        if call.name not in self.tool_names[k]:
            return False
        try:
            args = json.loads(call.arguments)
        except (ValueError, RecursionError):
            return False
        schema = self._schema(call.name)
        known = set(schema.get("properties", {}))
        return isinstance(args, dict) and set(args) <= known \
            and set(schema.get("required", [])) <= set(args)


def _name_in(body: str) -> str:
    m = re.search(r'"name"\s*:\s*"([^"]*)"', body)
    return m.group(1) if m else ""
