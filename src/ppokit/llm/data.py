"""Prompt datasets for token-level RL: rows of ``{"prompt": ..., <other columns>}``.

A row's ``prompt`` is either plain text (a string, used as it is) or a *conversation*: a
list of ``{"role": ..., "content": ...}`` messages, which is rendered with the tokenizer's
chat template and the generation prompt (the text that opens the assistant's turn), so the
model is asked to answer as the assistant. Every other column of a row (``answer``, an id,
...) is passed to the reward functions as a keyword argument of the same name.

Sources (:func:`load_rows`):

* a path: ``.jsonl`` (one JSON object a line; a line that is not an object is a plain-text
  prompt, as in earlier versions), ``.json`` (a list of objects, or JSON lines), ``.csv``
  (a header line; every value is a string), read by ppokit itself (no cache is written);
  ``.parquet`` through ``datasets`` (or ``pyarrow``) when installed; any other suffix: one
  plain-text prompt a line;
* a ``datasets.Dataset`` (one split; a ``DatasetDict`` is refused with the split names);
* a list of dicts (or of strings, each a plain-text prompt).

Rows must be JSON values: the run directory keeps its own copy of them
(``train_prompts.jsonl``, ``eval_prompts.jsonl``) so that resuming and evaluating read
nothing outside it.
"""

from __future__ import annotations

import csv
import json
import os

from ppokit.errors import UsageError

__all__ = ["load_rows", "check_rows", "is_conversation", "render_prompt", "split_rows",
           "TABULAR"]

TABULAR = (".jsonl", ".json", ".csv", ".parquet")


def load_rows(source, what: str = "train_dataset") -> list[dict]:
    """The rows of ``source`` (a path, a ``datasets.Dataset`` or a list), checked."""
    if source is None:
        raise UsageError(f"{what}: expected a path, a datasets.Dataset or a list of dicts, "
                         "got None")
    if isinstance(source, (str, os.PathLike)):
        rows = _read_path(os.fspath(source), what)
    elif isinstance(source, (list, tuple)):
        rows = [{"prompt": r} if isinstance(r, str) else r for r in source]
    elif type(source).__name__ == "DatasetDict":
        raise UsageError(f"{what}: a DatasetDict holds several splits "
                         f"({', '.join(map(str, source.keys()))}); pass one, e.g. ds['train']")
    elif hasattr(source, "column_names") and hasattr(source, "__iter__"):
        rows = [dict(r) for r in source]  # a datasets.Dataset
    else:
        raise UsageError(f"{what}: expected a path, a datasets.Dataset or a list of dicts, "
                         f"got {type(source).__name__}")
    return check_rows(rows, what)


def check_rows(rows: list, what: str) -> list[dict]:
    """Every row a dict with a valid ``prompt`` and JSON values; at least one row."""
    if not rows:
        raise UsageError(f"{what}: holds no rows")
    out = []
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            raise UsageError(f"{what}: row {i} is a {type(r).__name__}, expected a dict with "
                             "a 'prompt' key")
        if not all(isinstance(k, str) for k in r):
            raise UsageError(f"{what}: row {i} has a value without a column name (a CSV row "
                             "with more fields than the header?)")
        if "prompt" not in r:
            raise UsageError(f"{what}: row {i} has no 'prompt' column (columns: "
                             f"{', '.join(map(str, r)) or 'none'})")
        p = r["prompt"]
        if isinstance(p, str):
            if not p:
                raise UsageError(f"{what}: row {i}: the prompt is an empty string")
        elif isinstance(p, (list, tuple)):
            if not p or not all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                and isinstance(m.get("content"), str) for m in p):
                raise UsageError(f"{what}: row {i}: a conversational prompt is a non-empty "
                                 "list of {'role': str, 'content': str} messages")
            r = {**r, "prompt": [dict(m) for m in p]}
        else:
            raise UsageError(f"{what}: row {i}: 'prompt' must be a string or a list of "
                             f"{{role, content}} messages, got {type(p).__name__}")
        try:
            json.dumps(r)
        except (TypeError, ValueError) as exc:
            raise UsageError(f"{what}: row {i} is not made of JSON values ({exc})") from None
        out.append(r)
    return out


def _read_path(path: str, what: str) -> list[dict]:
    if not os.path.isfile(path):
        raise UsageError(f"{what}: no such file {path!r}")
    ext = os.path.splitext(path)[1].lower()
    if ext == ".parquet":
        return _read_parquet(path, what)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError:
        raise UsageError(f"{what}: {path} is not UTF-8 text") from None
    except OSError as exc:
        raise UsageError(f"{what}: cannot read {path} ({exc.strerror})") from None
    if ext == ".csv":
        return [dict(r) for r in csv.DictReader(text.splitlines())]
    if ext == ".json" and text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{what}: {path}: bad JSON: {exc}") from None
        return list(data)
    if ext in (".json", ".jsonl"):
        return _read_lines(path, text, what)
    return [{"prompt": line} for line in text.splitlines() if line.strip()]


def _read_lines(path: str, text: str, what: str) -> list[dict]:
    rows = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise UsageError(f"{what}: {path}:{i}: bad JSON: {exc}") from None
        else:
            rows.append({"prompt": line.rstrip("\n")})
    return rows


def _read_parquet(path: str, what: str) -> list[dict]:
    try:
        import datasets
    except ImportError:
        datasets = None
    if datasets is not None:
        return [dict(r) for r in datasets.Dataset.from_parquet(path)]
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise UsageError(f"{what}: reading Parquet needs the datasets package "
                         "(pip install datasets)") from None
    return pq.read_table(path).to_pylist()


def is_conversation(prompt) -> bool:
    return isinstance(prompt, list)


def render_prompt(tokenizer, prompt) -> str:
    """The text the model is given: a plain prompt unchanged; a conversation through the
    tokenizer's chat template, with the generation prompt appended."""
    if isinstance(prompt, str):
        return prompt
    if not getattr(tokenizer, "chat_template", None):
        raise UsageError("prompt: conversational prompts (lists of {role, content} "
                         "messages) need a tokenizer with a chat template, and this "
                         "tokenizer has none; set tokenizer.chat_template or give "
                         "plain-text prompts")
    return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)


def split_rows(rows: list[dict], eval_fraction: float, what: str = "train_dataset"
               ) -> tuple[list[dict], list[dict]]:
    """``(train, held_out)``: the last ``round(eval_fraction * n)`` rows (at least one when
    the fraction is positive) are held out; ``eval_fraction = 0`` holds none out."""
    if eval_fraction <= 0:
        return rows, []
    n = max(1, round(eval_fraction * len(rows)))
    if n >= len(rows):
        raise UsageError(f"eval_fraction: holding out {n} of {len(rows)} rows leaves none "
                         f"to train on; give more rows, a smaller eval_fraction or an "
                         "eval dataset")
    return rows[:-n], rows[-n:]
