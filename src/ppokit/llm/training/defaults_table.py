"""The token trainer's defaults as Markdown tables, rendered from the configuration it
resolves (:meth:`ppokit.llm.training.config.LLMConfig.resolved`: ``MODEL_DEFAULTS`` and
``LEARNING_RATES`` for what is trained, ``PRESETS`` for each algorithm), so the
documentation cannot drift from the code: docs/llm_defaults.md holds the output of
``python -m ppokit.llm.training.defaults_table`` between its markers, and
tests/test_llm_defaults_doc.py checks that it still is."""

from __future__ import annotations

from .config import LLMConfig
from .presets import ALGOS, MODEL_DEFAULTS, PRESETS

__all__ = ["BEGIN", "END", "render", "model_table", "algo_table"]

BEGIN = "<!-- generated: python -m ppokit.llm.training.defaults_table (do not edit) -->"
END = "<!-- end of generated tables -->"

BUILTIN = "the built-in model: `ppokit llm train` without `--model`"
GIVEN = ("a model you give: `--model`, or any model passed to `ppokit.llm.train` / "
         "`train_agent` (the tiny one of `build_tiny_model` too)")


def _value(v, key: str = "") -> str:
    if v is None:
        return "-"
    if key.startswith("guard_") and not v:
        return "0 (off)"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def model_table() -> str:
    """Which defaults follow what is trained (a setting you give always wins)."""
    builtin = LLMConfig().resolved()
    given = LLMConfig().resolved(pretrained=True)
    full = LLMConfig(lora_r=0).resolved(pretrained=True)
    keys = ["algo", "task", *MODEL_DEFAULTS["builtin"], "lora_alpha", "learning_rate"]
    rows = [f"| setting | {BUILTIN} | {GIVEN} |", "|---|---|---|"]
    for k in dict.fromkeys(keys):
        mine = _value(getattr(given, k), k)
        if k == "learning_rate":
            mine = f"{mine} with LoRA, {_value(full.learning_rate)} fully fine-tuned (lora_r=0)"
        rows.append(f"| `{k}` | {_value(getattr(builtin, k), k)} | {mine} |")
    return "\n".join(rows)


def algo_table() -> str:
    """What each ``--algo`` preset sets (resolved: a value the preset leaves is the
    configuration's own default)."""
    keys = list(dict.fromkeys(k for p in PRESETS.values() for k in p))
    rows = ["| algo | " + " | ".join(f"`{k}`" for k in keys) + " |",
            "|---" * (len(keys) + 1) + "|"]
    for algo in ALGOS:
        cfg = LLMConfig(algo=algo).resolved(pretrained=True)
        rows.append(f"| {algo} | " + " | ".join(_value(getattr(cfg, k)) for k in keys) + " |")
    return "\n".join(rows)


def render() -> str:
    """Both tables between the markers, as docs/llm_defaults.md holds them."""
    return "\n\n".join([BEGIN, model_table(), algo_table(), END])


if __name__ == "__main__":
    print(render())
