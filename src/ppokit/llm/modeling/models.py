"""Models for token-level RLHF: the built-in tiny model and tokenizer, loading a local
Hugging Face causal LM, the critic (a value head on a backbone) and reference copies.

Nothing is downloaded. The built-in tokenizer is character level over a fixed alphabet
(digits, a few separators, lower-case letters) plus four special tokens, built in code
with the ``tokenizers`` library and wrapped in ``PreTrainedTokenizerFast``. It is saved and
loaded with ``PreTrainedTokenizerFast`` directly: in transformers 5, ``AutoTokenizer`` on a
saved custom tokenizer may return the architecture's stock class, which splits and decodes
differently (docs/theory.md#loading-a-saved-tokenizer). Loading never runs remote code.
"""

from __future__ import annotations

import copy
import json
import os
from contextlib import contextmanager

import torch
from torch import nn

from ppokit.errors import UsageError

from .modeldir import check_model_config, check_tokenizer_files, check_weights

__all__ = [
    "ALPHABET",
    "SPECIAL_TOKENS",
    "build_char_tokenizer",
    "build_tiny_model",
    "load_tokenizer",
    "load_causal_lm",
    "load_lm",
    "load_gguf",
    "save_policy",
    "ValueModel",
    "AdaptersOff",
    "plain_model",
    "frozen_copy",
    "load_policy_state",
    "count_parameters",
    "quiet_transformers",
    "wrap_lora",
]

ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz:>=,+-|. "
SPECIAL_TOKENS = {"pad_token": "<pad>", "bos_token": "<bos>", "eos_token": "<eos>",
                  "unk_token": "<unk>"}
PPOKIT_MARKER = "ppokit_tokenizer.json"


def quiet_transformers() -> None:
    """Silence transformers' progress bars and advisory logs (ppokit prints its own)."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    except Exception:  # noqa: BLE001 - cosmetic only
        pass


def build_char_tokenizer():
    """A character-level ``PreTrainedTokenizerFast`` over :data:`ALPHABET`.

    Ids: ``<pad>`` 0, ``<bos>`` 1, ``<eos>`` 2, ``<unk>`` 3, then one id per character.
    ``encode`` adds no special tokens; ``decode(..., skip_special_tokens=True)`` returns the
    exact string (characters are fused, never joined with spaces).
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS.values())}
    for ch in ALPHABET:
        vocab.setdefault(ch, len(vocab))
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token=SPECIAL_TOKENS["unk_token"]))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, **SPECIAL_TOKENS)
    tok.padding_side = "left"
    return tok


def load_tokenizer(path: str):
    """Load the tokenizer of a model directory (no remote code).

    A ppokit built-in tokenizer (marked by ``ppokit_tokenizer.json``) is loaded with
    ``PreTrainedTokenizerFast`` directly; any other directory with ``AutoTokenizer``.
    A pad token is set (to EOS) when the tokenizer has none; padding side is left.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    check_local_dir(path)
    check_tokenizer_files(path)
    if os.path.exists(os.path.join(path, PPOKIT_MARKER)):
        tok = PreTrainedTokenizerFast.from_pretrained(path, local_files_only=True)
    else:
        try:
            tok = AutoTokenizer.from_pretrained(path, trust_remote_code=False,
                                                local_files_only=True)
        except Exception as exc:  # noqa: BLE001 - report one line
            raise UsageError(f"--model: cannot load a tokenizer from {path!r}: {exc}") from None
    if tok.eos_token_id is None:
        raise UsageError(f"--model: the tokenizer in {path!r} has no EOS token")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def build_tiny_model(tokenizer, *, arch: str = "llama", hidden: int = 64, layers: int = 2,
                     heads: int = 4, intermediate: int = 192, max_positions: int = 64,
                     seed: int = 0):
    """A tiny causal LM built from a config (Llama or GPT-2 architecture), untied from any
    hub checkpoint. Default: about 0.1M parameters."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    quiet_transformers()
    torch.manual_seed(seed)
    common = {"vocab_size": len(tokenizer), "bos_token_id": tokenizer.bos_token_id,
              "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    if arch == "llama":
        cfg = LlamaConfig(hidden_size=hidden, num_hidden_layers=layers,
                          num_attention_heads=heads, num_key_value_heads=heads,
                          intermediate_size=intermediate, max_position_embeddings=max_positions,
                          tie_word_embeddings=True, **common)
        model = LlamaForCausalLM(cfg)
    elif arch == "gpt2":
        cfg = GPT2Config(n_embd=hidden, n_layer=layers, n_head=heads, n_positions=max_positions,
                         n_inner=intermediate, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                         **common)
        model = GPT2LMHeadModel(cfg)
    else:
        raise UsageError(f"arch: expected 'llama' or 'gpt2', got {arch!r}")
    return model


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def load_causal_lm(path: str, dtype: torch.dtype = torch.float32):
    """Load a local causal LM directory with ``AutoModelForCausalLM`` (never remote code)."""
    from transformers import AutoModelForCausalLM

    quiet_transformers()
    check_local_dir(path)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=False, dtype=dtype,
                                                     local_files_only=True,
                                                     use_safetensors=True)
    except Exception as exc:  # noqa: BLE001
        raise UsageError(f"--model: cannot load a causal LM from {path!r}: {exc}") from None
    return model


def check_local_dir(path: str, what: str = "--model") -> None:
    """Models load only from a local directory: a name that is not one (``gpt2``) is an
    error, never a download from a model hub."""
    if not os.path.isdir(path):
        from .catalog import KNOWN_MODELS

        raise UsageError(f"{what}: {path!r} is not a local model directory, a .gguf file or "
                         f"the name of a fetched model ({', '.join(KNOWN_MODELS)}: `ppokit "
                         "llm fetch NAME`); ppokit never downloads from a model hub")
    check_weights(path, what)
    check_model_config(path, what)


def load_lm(path: str):
    """``(model, tokenizer)`` from a local model directory, a local ``.gguf`` file
    (:func:`load_gguf`) or the name of a fetched model (:mod:`ppokit.llm.modeling.fetch`)."""
    from .catalog import resolve_model

    path = resolve_model(path)
    if path.endswith(".gguf") and os.path.isfile(path):
        return load_gguf(path)
    tok = load_tokenizer(path)
    model = load_causal_lm(path)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tok.pad_token_id
    return model, tok


def load_gguf(path: str):
    """``(model, tokenizer)`` from a local GGUF file through transformers' GGUF support
    (the ``gguf`` package: ``pip install 'ppokit[gguf]'``). Quantised tensors are
    dequantised to float32, and the weights are moved into a plain model of the same class,
    so that the model trains and saves like any other (transformers refuses to save a model
    it still marks as GGUF-quantised). The tokenizer and its chat template come from the
    file."""
    import importlib.util

    if importlib.util.find_spec("gguf") is None:
        raise UsageError(f"--model: {path!r} is a GGUF file, which needs the gguf package "
                         "(pip install 'ppokit[gguf]')")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .gguf_size import check_gguf_size

    check_gguf_size(path)  # a truncated file said as such, before the parser sees it
    quiet_transformers()
    folder, name = os.path.split(os.path.abspath(path))
    try:
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True,
                                            trust_remote_code=False)
        quantised = AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=name, dtype=torch.float32, local_files_only=True,
            trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001 - report one line
        raise UsageError(f"--model: cannot load the GGUF file {path!r}: "
                         f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
                         ) from None
    cfg = quantised.config
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    model = type(quantised)(cfg)
    missing, unexpected = model.load_state_dict(quantised.state_dict(), strict=False)
    missing = [k for k in missing if k not in _tied_keys(model)]
    if missing or unexpected:
        raise UsageError(f"--model: the GGUF file {path!r} does not fill a "
                         f"{type(model).__name__} (missing {missing[:3]}, unexpected "
                         f"{unexpected[:3]})")
    model.tie_weights()
    model.eval()
    if tok.eos_token_id is None:
        raise UsageError(f"--model: the tokenizer in {path!r} has no EOS token")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tok.pad_token_id
    return model, tok


def _tied_keys(model) -> set:
    """State-dict keys that tying fills (the output head of a tied-embedding model)."""
    return {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()


def check_output_dir(path: str, what: str = "--out") -> None:
    """Refuse an output path that would lose something: an existing file, or a directory
    holding anything but a saved model (which is replaced whole). Checked before any
    training, and again when saving."""
    if os.path.lexists(path) and not os.path.islink(path):
        if not os.path.isdir(path):
            raise UsageError(f"{what}: {path!r} exists and is not a directory")
        entries = set(os.listdir(path))
        if entries and "config.json" not in entries:
            raise UsageError(f"{what}: {path!r} is a directory that holds something other "
                             "than a saved model; choose a new path")


def save_policy(model, tokenizer, path: str, extra: dict | None = None) -> None:
    """Save a model (safetensors) and its tokenizer as a local Hugging Face directory;
    mark ppokit's built-in tokenizer. Written in a temporary directory beside ``path`` and
    put in place whole (:func:`ppokit.io.atomic.replace_dir`): whatever stood at ``path``
    — an older export, a file, a symbolic link — is replaced, never written through. A
    model with non-finite weights is refused."""
    from ppokit.io.atomic import replace_dir

    bad = [n for n, t in model.state_dict().items()
           if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise UsageError(f"model: {len(bad)} weight tensor(s) hold NaN or inf (first: "
                         f"{bad[0]}); not saved to {path!r}")
    path = os.path.normpath(path)
    check_output_dir(path)
    parent = os.path.dirname(path) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if is_builtin(tokenizer):
            with open(os.path.join(tmp, PPOKIT_MARKER), "w") as f:
                json.dump({"alphabet": ALPHABET, **(extra or {})}, f)
        replace_dir(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def is_builtin(tokenizer) -> bool:
    return (tokenizer.convert_ids_to_tokens(0) == SPECIAL_TOKENS["pad_token"]
            and len(tokenizer) == len(SPECIAL_TOKENS) + len(ALPHABET))


def frozen_copy(model: nn.Module) -> nn.Module:
    """A deep copy with gradients off, in eval mode (the reference policy)."""
    ref = copy.deepcopy(model)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


class AdaptersOff(nn.Module):
    """A PEFT policy seen with its adapters disabled: the frozen base model that LoRA trains
    beside, which is exactly the starting policy — the token trainer's reference without a
    second copy of the weights. It holds the policy without registering it, so it has no
    parameters of its own (nothing to train, save, broadcast or shard); the rollout code
    runs it through :func:`plain_model`."""

    def __init__(self, peft_model: nn.Module):
        super().__init__()
        object.__setattr__(self, "peft", peft_model)

    def forward(self, *args, **kwargs):
        with self.peft.disable_adapter():
            return self.peft(*args, **kwargs)


@contextmanager
def plain_model(model):
    """The model to run: an :class:`AdaptersOff` as its PEFT model with the adapters
    disabled for the duration, anything else as it is."""
    if isinstance(model, AdaptersOff):
        with model.peft.disable_adapter():
            yield model.peft
    else:
        yield model


def load_policy_state(model: nn.Module, state: dict, *, lora: bool) -> None:
    """Load a checkpoint's policy tensors into ``model``: all of them, or with ``lora``
    the adapters only (a LoRA run's checkpoint leaves out the frozen base, which the run's
    ``reference/`` directory holds; a full state is accepted too). ``ValueError`` when the
    tensors do not fit."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad} if lora else set()
    frozen |= {n for n, _ in model.named_buffers()}
    if model.config.tie_word_embeddings if hasattr(model, "config") else False:
        frozen |= {n for n in missing if n.endswith("lm_head.weight")}
    left = sorted(set(missing) - frozen)
    if unexpected or left:
        raise ValueError(f"policy tensors do not match the model: missing {left[:3]}, "
                         f"unexpected {sorted(unexpected)[:3]}")


def backbone_of(lm: nn.Module) -> nn.Module:
    """The transformer body of a causal LM (``base_model``: ``model`` for Llama,
    ``transformer`` for GPT-2), returning ``last_hidden_state``."""
    if hasattr(lm, "get_base_model"):  # a peft wrapper: the model with adapters injected
        lm = lm.get_base_model()
    body = getattr(lm, "base_model", None)
    if body is None or body is lm:
        raise UsageError(f"model: cannot find the backbone of {type(lm).__name__}")
    return body


def hidden_size_of(lm: nn.Module) -> int:
    cfg = lm.get_base_model().config if hasattr(lm, "get_base_model") else lm.config
    for name in ("hidden_size", "n_embd", "d_model"):
        if getattr(cfg, name, None):
            return int(getattr(cfg, name))
    raise UsageError(f"model: cannot find the hidden size of {type(lm).__name__}")


class ValueModel(nn.Module):
    """Critic: a scalar head on a transformer backbone.

    ``separate=True`` (default): the backbone is a copy of the policy's, trained only by
    the value loss. ``separate=False``: the head sits on the policy's own backbone (shared
    parameters; the value loss then also moves the policy's body).
    """

    def __init__(self, policy_lm: nn.Module, separate: bool = True):
        super().__init__()
        self.separate = separate
        if separate:
            self.body = copy.deepcopy(backbone_of(policy_lm))
            for p in self.body.parameters():
                p.requires_grad_(True)
        else:
            self._shared = [policy_lm]  # not registered: parameters belong to the policy
        self.head = nn.Linear(hidden_size_of(policy_lm), 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids, attention_mask, position_ids, hidden_states=None):
        """Values ``[B, L]``: the value of the state *after* reading position t."""
        if hidden_states is None:
            body = self.body if self.separate else backbone_of(self._shared[0])
            hidden_states = body(input_ids=input_ids, attention_mask=attention_mask,
                                 position_ids=position_ids).last_hidden_state
        # the head in float32 even when the body ran under bfloat16 autocast: values enter
        # the returns and the value loss, which stay float32
        with torch.autocast(hidden_states.device.type, enabled=False):
            return self.head(hidden_states.float()).squeeze(-1)


def wrap_lora(model, r: int, alpha: float):
    """The policy with LoRA adapters on all linear layers (peft); the base stays frozen."""
    import warnings

    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules="all-linear",
                     task_type="CAUSAL_LM")
    with warnings.catch_warnings():  # peft asks transformers a question it has renamed
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing",
                                category=FutureWarning)
        return get_peft_model(model, cfg)
