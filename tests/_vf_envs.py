"""verifiers environments over the built-in model's characters, one of each kind ppokit
plays: a single-turn task with a rubric, a multi-turn game, a tool task; plus two broken
ones. ``load_environment`` is verifiers' entry point for ``--env verifiers:_vf_envs``."""

import verifiers as vf
from datasets import Dataset


def last_answer(completion) -> str:
    for m in reversed(completion):
        if m["role"] == "assistant":
            return (m["content"] or "").strip()
    return ""


def correct(completion, answer, **kw) -> float:
    return float(last_answer(completion) == answer)


def sum_env() -> vf.Environment:
    rows = [{"question": f"{a}+{b}=", "answer": str(a + b)} for a in range(5) for b in range(4)]
    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows[:12]),
                            eval_dataset=Dataset.from_list(rows[12:]),
                            rubric=vf.Rubric(funcs=[correct]))


class Guess(vf.MultiTurnEnv):
    """Guess the row's number: ``higher:`` / ``lower:`` until right."""

    async def setup_state(self, state):
        state["target"] = int(state["answer"])

    async def env_response(self, messages, state, **kw):
        text = (messages[-1]["content"] or "").strip()
        guess = int(text) if text.isdigit() else None
        if guess == state["target"]:
            state["won"] = True
            state["final_env_response"] = [vf.UserMessage(content="correct")]
            return state["final_env_response"]
        hint = "higher:" if guess is not None and guess < state["target"] else "lower:"
        return [vf.UserMessage(content=hint)]


def won(state, **kw) -> float:
    return 1.0 if state.get("won") else 0.0


def guess_env(n: int = 8, max_turns: int = 5) -> vf.Environment:
    rows = [{"question": f"guess 1-{n}:", "answer": str(t)} for t in range(1, n + 1)]
    return Guess(dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[won]),
                 max_turns=max_turns)


def mul(a: int, b: int) -> int:
    """Multiply two whole numbers.

    Args:
        a: the first factor
        b: the second factor
    """
    return int(a) * int(b)


def tool_env() -> vf.Environment:
    rows = [{"question": f"{a}x{b}=", "answer": str(a * b)}
            for a in range(11, 20) for b in range(11, 14)]
    return vf.ToolEnv(tools=[mul], dataset=Dataset.from_list(rows),
                      rubric=vf.Rubric(funcs=[correct]), max_turns=3)


class Crashing(Guess):
    async def env_response(self, messages, state, **kw):
        raise RuntimeError("the board fell over")


class Forgetful(Guess):
    """Sends only the last message each turn (a conversation that does not grow)."""

    async def get_prompt_messages(self, state):
        msgs = await super().get_prompt_messages(state)
        return msgs[-1:] if state["trajectory"] else msgs


def broken_env(kind: str) -> vf.Environment:
    cls = {"crash": Crashing, "forget": Forgetful}[kind]
    rows = [{"question": "guess 1-8:", "answer": "3"}]
    return cls(dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[won]), max_turns=4)


def load_environment(kind: str = "guess", **kw) -> vf.Environment:
    return {"sum": sum_env, "guess": guess_env, "tool": tool_env}[kind](**kw)
