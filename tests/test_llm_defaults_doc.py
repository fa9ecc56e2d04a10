"""docs/llm_defaults.md holds the token trainer's defaults as the code resolves them (one
table, rendered by ppokit.llm.training.defaults_table), and the pages that speak of the
defaults link to it rather than keeping tables of their own."""

from __future__ import annotations

import re
from pathlib import Path

from ppokit.llm.training.config import LLMConfig
from ppokit.llm.training.defaults_table import BEGIN, END, model_table, render
from ppokit.llm.training.presets import LEARNING_RATES, MODEL_DEFAULTS

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_the_page_holds_the_rendered_tables():
    text = (DOCS / "llm_defaults.md").read_text()
    block = text[text.index(BEGIN):text.index(END) + len(END)]
    assert block == render(), ("docs/llm_defaults.md is out of date: replace its generated "
                               "block with `python -m ppokit.llm.training.defaults_table`")


def test_the_table_is_what_the_trainer_resolves():
    rows = {r.split("|")[1].strip(" `"): [c.strip() for c in r.split("|")[2:4]]
            for r in model_table().splitlines()[2:]}
    assert rows["temperature"] == [f"{MODEL_DEFAULTS['builtin']['temperature']:g}",
                                   f"{MODEL_DEFAULTS['pretrained']['temperature']:g}"]
    assert rows["lora_r"] == ["0", "16"]
    assert rows["learning_rate"][0] == f"{LEARNING_RATES['builtin']:g}"
    # a model object passed to ppokit.llm.train resolves as the second column says
    cfg = LLMConfig().resolved(pretrained=True)
    assert (cfg.temperature, cfg.lora_r) == (0.7, 16)


def test_both_pages_link_the_one_table_and_keep_none_of_their_own():
    for name in ("from_trl.md", "real_models.md"):
        text = (DOCS / name).read_text()
        assert "(llm_defaults.md)" in text, name
        assert not re.search(r"^\| setting \| built-in model", text, re.M), name
