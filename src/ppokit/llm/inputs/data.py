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

from ppokit.errors import UsageError, UserCodeError, with_suffix

__all__ = ["load_rows", "check_rows", "is_conversation", "render_prompt", "split_rows",
           "check_prompts", "model_context", "read_jsonl_objects", "TABULAR"]

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
    from ppokit.io.atomic import MAX_DATA_FILE, check_named_file, read_named_text

    ext = os.path.splitext(path)[1].lower()
    if ext == ".parquet":
        check_named_file(path, what, MAX_DATA_FILE, "Parquet file")
        return _read_parquet(path, what)
    text = read_named_text(path, what, MAX_DATA_FILE, "prompts file")
    if ext == ".csv":
        return [dict(r) for r in csv.DictReader(text.splitlines())]
    if ext == ".json" and text.lstrip().startswith("["):
        return list(_json(text, f"{what}: {path}"))
    if ext in (".json", ".jsonl"):
        return _read_lines(path, text, what)
    return [{"prompt": line} for line in text.splitlines() if line.strip()]


def _json(text: str, where: str):
    """``text`` parsed as JSON, each problem an error naming ``where``."""
    from ppokit.io.atomic import check_nesting

    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{where}: bad JSON: {exc}") from None
    except RecursionError:
        raise UsageError(f"{where}: lists and objects nested too deeply") from None
    check_nesting(value, where)
    return value


def _read_lines(path: str, text: str, what: str) -> list[dict]:
    rows = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            rows.append(_json(line, f"{what}: {path}:{i}"))
        else:
            rows.append({"prompt": line.rstrip("\n")})
    return rows


def read_jsonl_objects(path: str, flag: str, keys: tuple[str, ...], what: str) -> list[dict]:
    """The rows of a JSONL file the user named with ``flag`` (demonstrations, preference
    pairs): each non-blank line a JSON object with string values for ``keys``. The file is
    read with :func:`ppokit.io.atomic.read_named_text`'s rules; every problem is one line
    naming ``flag``, the file and the line."""
    from ppokit.io.atomic import MAX_DATA_FILE, read_named_text

    text = read_named_text(path, flag, MAX_DATA_FILE, what)
    need = ", ".join(keys)
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise UsageError(f"{flag}: {path}:{i}: not valid JSON ({exc}); expected an "
                             f"object with {need}") from None
        except RecursionError:
            raise UsageError(f"{flag}: {path}:{i}: nested too deeply; expected an object "
                             f"with {need}") from None
        if not isinstance(obj, dict):
            raise UsageError(f"{flag}: {path}:{i}: a JSON {type(obj).__name__}, expected an "
                             f"object with {need}")
        missing = [k for k in keys if k not in obj]
        if missing:
            raise UsageError(f"{flag}: {path}:{i}: missing key(s) {', '.join(missing)}")
        bad = [k for k in keys if not isinstance(obj[k], str)]
        if bad:
            raise UsageError(f"{flag}: {path}:{i}: {bad[0]!r} is a "
                             f"{type(obj[bad[0]]).__name__}, expected a string")
        out.append({k: obj[k] for k in keys})
    return out


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
                         "(pip install 'ppokit[llm]')") from None
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
    try:
        return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    except Exception as exc:  # noqa: BLE001 - the template is the user's code (Jinja)
        roles = sorted({str(m.get("role")) for m in prompt if isinstance(m, dict)})
        text = str(exc).strip().splitlines()
        raise UserCodeError(f"prompt: the tokenizer's chat template raised "
                            f"{type(exc).__name__}{': ' + text[0][:200] if text else ''} on a "
                            f"conversation with roles {', '.join(roles)}") from exc


def model_context(model) -> tuple[int | None, bool]:
    """``(positions, hard)``: the positions a causal LM reads (its config's
    ``max_position_embeddings`` or ``n_positions``; None when it does not say) and whether
    that is a hard limit (learned absolute positions, as GPT-2's ``n_positions``: a longer
    sequence cannot run) rather than the length rotary positions were trained to."""
    cfg = getattr(model, "config", None)
    for name, hard in (("n_positions", True), ("max_position_embeddings", False)):
        v = getattr(cfg, name, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v, hard
    return None, False


def check_prompts(tokenizer, rows: list[dict], held_out: list[dict],
                  context: tuple[int | None, bool], max_new_tokens: int, log=print
                  ) -> list[str]:
    """The texts of the training ``rows`` (conversations rendered with the chat template),
    checked before any work: every training and held-out row renders (its index named
    when it does not) and fits the model's context (:func:`model_context`): a prompt that
    leaves no position for the completion is refused, not cut (the model would never see
    its start), and so is one that leaves fewer than ``max_new_tokens`` under a hard limit
    (rotary positions run on past the trained length). A warning says when most of the
    prompts' tokens are the tokenizer's unknown token (characters outside its vocabulary:
    the model never sees them)."""
    positions, hard = context
    texts, unknown, total = [], 0, 0
    unk = getattr(tokenizer, "unk_token_id", None)
    for what, group in (("prompts", rows), ("held-out prompts", held_out)):
        for i, r in enumerate(group):
            try:
                text = render_prompt(tokenizer, r["prompt"])
            except UsageError as exc:
                raise with_suffix(exc, f" ({what}, row {i})") from exc.__cause__
            if positions is not None:
                room = positions - 1  # (a BOS token may go first)
                ids = tokenizer(text, add_special_tokens=False, truncation=True,
                                max_length=room + 1)["input_ids"]
                need = max_new_tokens if hard else 1
                if len(ids) + need > room:
                    more = "at least " if len(ids) > room else ""
                    raise UsageError(
                        f"{what}: row {i} is too long for the model: {more}{len(ids)} tokens "
                        f"({len(text)} characters) and {need} for the completion, and the "
                        f"model reads at most {positions} positions; shorten the prompt"
                        + (" or max_new_tokens" if hard else "")
                        + " or use a model with a longer context")
                if unk is not None and what == "prompts":
                    unknown += sum(1 for t in ids if t == unk)
                    total += len(ids)
            if what == "prompts":
                texts.append(text)
    if total and unknown > total / 2:
        log(f"warning: {unknown} of the {total} prompt tokens are the tokenizer's unknown "
            f"token ({tokenizer.unk_token}): most prompt characters are outside its "
            "vocabulary, so the model does not see them")
    return texts


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
