"""Bad input ends with exit status 2 and one line naming the argument, before any work.

Every command case runs ``ppokit.cli.main`` in-process in a scratch directory that already
holds a run directory and a saved model, and checks: status 2, a single stderr line
``ppokit CMD: error: ...`` that names the argument, no traceback, and every file in the
scratch directory byte-identical afterwards (nothing created, nothing changed). The Python
entry points (TrainConfig / resolve_config, LLMConfig.resolved, sft_train,
train_reward_model, dpo_train, run_bench) raise UsageError naming the field or flag.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppokit.algos.config import LIMITS, TrainConfig, resolve_config
from ppokit.cli import main
from ppokit.errors import UsageError

GIB = 2**30


@pytest.fixture(autouse=True)
def small_machine(monkeypatch):
    """4 GiB available, whatever the machine has: the memory bound is tested the same
    everywhere (and no case can start a huge allocation on a large machine). A case that
    gets past validation fails at once instead of training."""
    import ppokit.algos
    import ppokit.llm.training.trainer
    from ppokit.algos import memory

    monkeypatch.setattr(memory, "available_memory", lambda: 4 * GIB)

    def no_training(*args, **kwargs):
        raise AssertionError("a refused case reached the trainer")

    monkeypatch.setattr(ppokit.algos, "Trainer", no_training)
    monkeypatch.setattr(ppokit.llm.training.trainer, "TokenTrainer", no_training)


def snapshot(root: Path) -> dict[str, object]:
    out: dict[str, object] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = p.read_bytes()
    return out


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A saved built-in tiny policy (so dpo cases skip the warm-start SFT)."""
    from ppokit.llm.modeling.models import build_char_tokenizer, build_tiny_model, save_policy

    d = tmp_path_factory.mktemp("model") / "tiny"
    tok = build_char_tokenizer()
    save_policy(build_tiny_model(tok), tok, str(d))
    return d


@pytest.fixture
def scratch(tmp_path, monkeypatch) -> Path:
    """The working directory of a case: a run directory with its files, a previous model
    export at ``out`` and a config file, all of which must stay as they are."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "notes.txt").write_text("an earlier run's notes\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text('{"model_type": "llama"}\n')
    (out / "model.safetensors").write_bytes(b"\x00previous weights\x01")
    (tmp_path / "empty_run").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


def refused(argv: list[str], name: str, capsys, root: Path) -> str:
    before = snapshot(root)
    capsys.readouterr()
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err
    lines = err.rstrip("\n").split("\n")
    assert len(lines) == 1 and err.endswith("\n"), err
    assert lines[0].startswith(f"ppokit {argv[0]}: error: "), err
    assert name in lines[0], err
    assert snapshot(root) == before, "files changed"
    return lines[0]


# ------------------------------------------------------------------ ppokit train

TRAIN = [
    (["--num-envs", "0"], "--num-envs"),
    (["--num-envs", "100000000"], "--num-envs"),
    (["--num-envs", "65536", "--total-steps", "1e12", "--set", "n_steps=16384"],
     "--num-envs (n_envs): a rollout"),  # ~32 GiB of rollout buffer
    (["--set", "n_steps=100000000000"], "n_steps"),
    (["--set", "n_steps=16777216", "--num-envs", "16", "--total-steps", "1e9"],
     "n_steps: a rollout"),  # 8 GiB
    (["--set", "net_arch=100000,100000"], "net_arch"),
    (["--set", "net_arch=20000,20000"], "net_arch: [20000, 20000] makes about"),
    (["--set", "net_arch=0"], "net_arch"),
    (["--set", "net_arch=[64, 0]"], "net_arch"),
    (["--set", "net_arch=64,abc"], "net_arch"),
    (["--set", "ent_coef=1e308"], "ent_coef"),
    (["--set", "ent_coef=nan"], "ent_coef"),
    (["--set", "ent_coef=-1"], "ent_coef"),
    (["--set", "torch_threads=100000"], "torch_threads"),
    (["--set", "torch_threads=-1"], "torch_threads"),
    (["--set", "batch_size=-1"], "batch_size"),
    (["--set", "batch_size=1e9"], "batch_size"),
    (["--set", "gamma=5"], "gamma"),
    (["--set", "gamma=-0.1"], "gamma"),
    (["--set", "gae_lambda=1.5"], "gae_lambda"),
    (["--set", "learning_rate=0"], "learning_rate"),
    (["--set", "learning_rate=inf"], "learning_rate"),
    (["--set", "learning_rate=1e9"], "learning_rate"),
    (["--set", "clip_range=nan"], "clip_range"),
    (["--set", "clip_range_vf=-1"], "clip_range_vf"),
    (["--set", "vf_coef=1e300"], "vf_coef"),
    (["--set", "max_grad_norm=0"], "max_grad_norm"),
    (["--set", "target_kl=inf"], "target_kl"),
    (["--set", "kl_coef=nan"], "kl_coef"),
    (["--set", "kl_target=0"], "kl_target"),
    (["--set", "clip_obs=inf"], "clip_obs"),
    (["--set", "clip_reward=0"], "clip_reward"),
    (["--set", "optimizer_eps=0"], "optimizer_eps"),
    (["--set", "log_std_init=1e6"], "log_std_init"),
    (["--set", "checkpoint_every=0"], "checkpoint_every"),
    (["--set", "keep_checkpoints=0"], "keep_checkpoints"),
    (["--set", "n_epochs=0"], "n_epochs"),
    (["--set", "n_epochs=1e9"], "n_epochs"),
    (["--set", "use_critic=maybe"], "use_critic"),
    (["--set", "activation=gelu"], "activation"),
    (["--set", "env_id="], "env_id"),
    (["--set", "lerning_rate=0.1"], "did you mean 'learning_rate'"),
    (["--set", "num_envs=4"], "did you mean 'n_envs'"),
    (["--total-steps", "0"], "--total-steps (total_timesteps)"),
    (["--total-steps", "1e30"], "--total-steps (total_timesteps)"),
    (["--seed", "-1"], "--seed (seed)"),
    (["--seed", "9223372036854775808"], "--seed (seed)"),
    (["--set", "seed=18446744073709551616"], "seed"),
    (["--env", ""], "--env (env_id)"),
    (["--env", "Cart Pole"], "--env (env_id)"),
    (["--algo", ""], "--algo (algo)"),
]


@pytest.mark.parametrize("argv, name", TRAIN, ids=[" ".join(a) for a, _ in TRAIN])
def test_train_refuses(argv, name, capsys, scratch):
    refused(["train", "--run-dir", "run", "--no-progress", *argv], name, capsys, scratch)


TOML = [
    ("gamma = [0.9]\n", "gamma"),
    ('net_arch = [64, "x"]\n', "net_arch"),
    ("[optimizer]\nlr = 1\n", "optimizer"),
    ("[policy]\nnet_arch = [64]\n", "policy: expected a string"),
    ("ent_coef = 1e308\n", "ent_coef"),
    ("seed = 9223372036854775807\n", "seed"),
    ('env_id = ""\n', "env_id"),
    ("n_steps = 32.5\n", "n_steps"),
]


@pytest.mark.parametrize("text, name", TOML, ids=[t for t, _ in TOML])
def test_train_config_file_refused(text, name, capsys, scratch):
    (scratch / "c.toml").write_text(text)
    refused(["train", "--run-dir", "run", "--config", "c.toml"], name, capsys, scratch)


@pytest.mark.parametrize("content", [None, b"gamma = 0.9\n# \xff\xfe\n", b"train = [1, 2]\n",
                                     b"gamma = \n"], ids=["directory", "not-utf8",
                                                          "train-not-a-table", "bad-toml"])
def test_train_config_file_unreadable(content, capsys, scratch):
    path = scratch / "c.toml"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    refused(["train", "--run-dir", "run", "--config", "c.toml"], "--config", capsys, scratch)


def test_torch_threads_refused_in_a_real_process(tmp_path):
    """The case that used to segfault, as a user runs it."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    p = subprocess.run([sys.executable, "-m", "ppokit.cli", "train", "--run-dir",
                        str(tmp_path / "r"), "--set", "torch_threads=100000"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and "torch_threads" in p.stderr, p.stderr
    assert not (tmp_path / "r").exists()


# ------------------------------------------------------------------ ppokit llm train

LLM_TRAIN = [
    (["--kl-coef", "nan"], "kl_coef"),
    (["--kl-coef", "inf"], "kl_coef"),
    (["--kl-coef", "-1"], "kl_coef"),
    (["--temperature", "inf"], "temperature"),
    (["--temperature", "0"], "temperature"),
    (["--temperature", "nan"], "temperature"),
    (["--gamma", "5"], "gamma"),
    (["--gae-lambda", "-0.5"], "gae_lambda"),
    (["--max-new-tokens", "0"], "max_new_tokens"),
    (["--max-new-tokens", "10000000"], "max_new_tokens"),
    (["--checkpoint-every", "0"], "checkpoint_every"),
    (["--n-eval-prompts", "0"], "n_eval_prompts"),
    (["--learning-rate", "inf"], "learning_rate"),
    (["--learning-rate", "0"], "learning_rate"),
    (["--critic-lr", "nan"], "critic_lr"),
    (["--clip-range", "0"], "clip_range"),
    (["--clip-range-vf", "nan"], "clip_range_vf"),
    (["--vf-coef", "inf"], "vf_coef"),
    (["--ent-coef", "nan"], "ent_coef"),
    (["--max-grad-norm", "0"], "max_grad_norm"),
    (["--target-kl", "nan"], "target_kl"),
    (["--kl-target", "-1"], "kl_target"),
    (["--score-clip", "0"], "score_clip"),
    (["--truncation-penalty", "nan"], "truncation_penalty"),
    (["--lora-alpha", "nan"], "lora_alpha"),
    (["--sft-lr", "inf"], "sft_lr"),
    (["--sft-steps", "0"], "sft_steps"),
    (["--seed", "-1"], "seed"),
    (["--seed", "18446744073709551616"], "seed"),
    (["--iterations", "0"], "iterations"),
    (["--samples-per-prompt", "0"], "samples_per_prompt"),
    (["--prompts-per-iter", "100000000"], "prompts_per_iter"),
    (["--n-epochs", "0"], "n_epochs"),
    (["--time-limit", "nan"], "time_limit"),
    (["--samples-logged", "-1"], "samples_logged"),
    (["--model", ""], "model"),
    (["--eval-fraction", "1"], "eval_fraction"),
    (["--task", "sorting"], "task"),
    (["--reward-weights", "1,x"], "reward_weights"),
    (["--reward-weights", "nan"], "reward_weights"),
    (["--reward", "ppokit.llm.inputs.task:correct_answer", "--reward-weights", "1,2"],
     "reward_weights"),
    (["--reward", "nocolon_no_dir"], "reward"),
    (["--algo", "grpo", "--prompts-per-iter", "4096", "--samples-per-prompt", "256",
      "--max-new-tokens", "4096"], "tokens per iteration need"),
]


@pytest.mark.parametrize("argv, name", LLM_TRAIN, ids=[" ".join(a) for a, _ in LLM_TRAIN])
def test_llm_train_refuses(argv, name, capsys, scratch):
    refused(["llm", "train", "--run-dir", "run", "--no-progress", "--no-eval", *argv], name,
            capsys, scratch)


# ------------------------------------------------------ ppokit llm sft / rm / dpo / bench

LLM_OTHER = [
    (["sft", "--out", "out", "--steps", "0"], "--steps"),
    (["sft", "--out", "out", "--steps", "-5"], "--steps"),
    (["sft", "--out", "out", "--batch-size", "0"], "--batch-size"),
    (["sft", "--out", "out", "--lr", "inf"], "--lr"),
    (["sft", "--out", "out", "--lr", "0"], "--lr"),
    (["sft", "--out", "out", "--lr", "nan"], "--lr"),
    (["sft", "--out", "out", "--seed", "-1"], "--seed"),
    (["rm", "--out", "out", "--lr", "inf"], "--lr"),
    (["rm", "--out", "out", "--epochs", "0"], "--epochs"),
    (["rm", "--out", "out", "--batch-size", "0"], "--batch-size"),
    (["rm", "--out", "out", "--eval-frac", "nan"], "--eval-frac"),
    (["rm", "--out", "out", "--eval-frac", "1"], "--eval-frac"),
    (["rm", "--out", "out", "--n-pairs", "0"], "--n-pairs"),
    (["dpo", "--out", "out", "--model", "MODEL", "--beta", "nan"], "--beta"),
    (["dpo", "--out", "out", "--model", "MODEL", "--beta", "-1"], "--beta"),
    (["dpo", "--out", "out", "--model", "MODEL", "--beta", "0"], "--beta"),
    (["dpo", "--out", "out", "--model", "MODEL", "--beta", "inf"], "--beta"),
    (["dpo", "--out", "out", "--model", "MODEL", "--lr", "inf"], "--lr"),
    (["dpo", "--out", "out", "--model", "MODEL", "--epochs", "0"], "--epochs"),
    (["dpo", "--out", "out", "--model", "MODEL", "--batch-size", "0"], "--batch-size"),
    (["bench", "--length", "-1"], "--length"),
    (["bench", "--length", "0"], "--length"),
    (["bench", "--batch", "0"], "--batch"),
    (["bench", "--iterations", "0"], "--iterations"),
    (["bench", "--algo", "trpo"], "--algo"),
    (["bench", "--batch", "65536", "--length", "1048576"], "--length: --batch * --length"),
    (["eval", "empty_run", "--n-prompts", "0"], "--n-prompts"),
    (["eval", "empty_run", "--temperature", "inf"], "--temperature"),
]


@pytest.mark.parametrize("argv, name", LLM_OTHER, ids=[" ".join(a) for a, _ in LLM_OTHER])
def test_llm_commands_refuse(argv, name, capsys, scratch, tiny_model_dir):
    argv = [str(tiny_model_dir) if a == "MODEL" else a for a in argv]
    refused(["llm", *argv], name, capsys, scratch)


# ------------------------------------------------------------------ ppokit plot / report

def _metrics(path: Path, rows: list) -> None:
    path.mkdir(exist_ok=True)
    (path / "metrics.jsonl").write_text("".join(
        (r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


def test_plot_rows_without_global_step_is_nothing_to_plot(capsys, scratch):
    _metrics(scratch / "run", [{"iteration": 1, "episode_return_mean": 5.0},
                               {"iteration": 2, "global_step": "many",
                                "episode_return_mean": 6.0}])
    line = refused(["plot", "run", "--out", "c.png"], "nothing to plot", capsys, scratch)
    assert "run" in line and "global_step" in line


def test_plot_run_without_episodes_is_nothing_to_plot(capsys, scratch):
    _metrics(scratch / "run", [{"iteration": 1, "global_step": 64,
                                "episode_return_mean": None}])
    refused(["plot", "run"], "nothing to plot", capsys, scratch)


@pytest.mark.parametrize("out, name", [("missing/c.png", "--out: no such directory"),
                                       ("run", "--out: run is a directory"),
                                       ("c.xyz", "--out"), ("", "--out")])
def test_plot_bad_out(out, name, capsys, scratch):
    _metrics(scratch / "run", [{"iteration": 1, "global_step": 64,
                                "episode_return_mean": 3.0}])
    refused(["plot", "run", "--out", out], name, capsys, scratch)


def test_plot_not_a_run_dir(capsys, scratch):
    refused(["plot", "empty_run"], "empty_run: no metrics.jsonl", capsys, scratch)


def test_plot_leaves_out_unplottable_runs_and_replaces_a_link(capsys, scratch):
    _metrics(scratch / "good", [{"iteration": i, "global_step": 64 * i,
                                 "episode_return_mean": float(i)} for i in range(1, 4)])
    _metrics(scratch / "bad", [{"iteration": 1}])
    (scratch / "target.png").write_bytes(b"not yours")
    os.symlink(scratch / "target.png", scratch / "c.png")
    assert main(["plot", "good", "bad", "--out", "c.png"]) == 0
    err = capsys.readouterr().err
    assert "bad: no row with both global_step and episode_return_mean" in err
    assert (scratch / "target.png").read_bytes() == b"not yours"
    assert not (scratch / "c.png").is_symlink()
    assert (scratch / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_runs_of_different_lengths_are_labelled_not_cut(capsys, scratch, monkeypatch):

    cfg = json.dumps({"algo": "ppo", "env_id": "CartPole-v1"})
    for name, n in (("short", 5), ("long", 12)):
        _metrics(scratch / name, [{"iteration": i, "global_step": 100 * i,
                                   "episode_return_mean": float(i)} for i in range(1, n + 1)])
        (scratch / name / "config.json").write_text(cfg)
    drawn = []
    import matplotlib.axes

    real_plot = matplotlib.axes.Axes.plot

    def spy(ax, *args, **kw):
        drawn.append((list(args[0]), kw.get("label")))
        return real_plot(ax, *args, **kw)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", spy)
    assert main(["plot", "short", "long", "--out", "c.png"]) == 0
    err = capsys.readouterr().err
    assert "runs end at different steps (1,200, 500)" in err
    assert "mean covers steps up to 500" in err
    labels = [lab for _, lab in drawn if lab]
    assert labels == ["ppo CartPole-v1 (mean of 2 up to step 500)"]
    # the longer run's steps beyond 500 are drawn (not silently cut)
    assert max(max(x) for x, _ in drawn) == 1200


def test_report_deeply_nested_line(capsys, scratch):
    _metrics(scratch / "run", [{"iteration": 1}, "[" * 100_000 + "]" * 100_000,
                               {"iteration": 2}])
    refused(["report", "run"], "line 2 is nested too deeply", capsys, scratch)


def test_report_survives_odd_values(capsys, scratch):
    rows = [{"iteration": 10**30 if i == 0 else i, "global_step": 10**400 if i == 1 else i,
             "[/x]": float("nan"), "entropy": "high", "approx_kl": [1, 2],
             "clipfrac": {"a": 1}, "early_stop_epoch": 10**30, "explained_variance": True}
            for i in range(8)]
    (scratch / "run").mkdir(exist_ok=True)
    (scratch / "run" / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows))  # NaN as JSON NaN
    for extra in ([], ["--json"]):
        assert main(["report", "run", *extra]) == 0
        cap = capsys.readouterr()
        assert "Traceback" not in cap.err and "metrics-nonfinite" in cap.out


_json_scalar = st.one_of(st.none(), st.booleans(), st.integers(-2**80, 2**80),
                         st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=5))
_json_value = st.recursive(_json_scalar, lambda c: st.lists(c, max_size=3)
                           | st.dictionaries(st.text(max_size=4), c, max_size=3), max_leaves=6)
_KEYS = ["iteration", "global_step", "clipfrac", "approx_kl", "entropy", "learning_rate",
         "clip_range", "episode_return_mean", "explained_variance", "value_loss",
         "early_stop", "early_stop_epoch", "early_stopped", "score_mean", "kl_ref",
         "response_length_mean", "truncated_frac", "non_score_reward"]


@settings(max_examples=30)
@given(st.lists(st.dictionaries(st.sampled_from(_KEYS), _json_value), min_size=1,
                max_size=12))
def test_diagnose_takes_any_json_records(records):
    from ppokit.diagnose import MetricsTable, diagnose

    findings = diagnose(MetricsTable(records, source="x"))
    json.dumps([f.to_dict() for f in findings], allow_nan=False)


# ------------------------------------------------------------------ Python entry points

def _bad_values(name: str) -> list:
    lo, hi, lo_open = LIMITS[name]
    if isinstance(hi, int) and not isinstance(lo, float):
        return [lo - 1, hi + 1 if name != "torch_threads" else 10**5, 2**64, 1.5, True, "3"]
    bad = [math.nan, math.inf, -math.inf, hi * 10 + 1, "0.1", None, 10**400]
    if lo_open:
        bad.append(lo)
    return bad


_CASES = [(n, v) for n in LIMITS for v in _bad_values(n)
          if not (v is None and n in ("clip_range_vf", "max_grad_norm", "target_kl",
                                      "stop_at_return"))]


@pytest.mark.parametrize("name, value", _CASES, ids=[f"{n}={v!r}"[:40] for n, v in _CASES])
def test_train_config_names_the_field(name, value):
    kw = {name: value}
    with pytest.raises(UsageError, match=f"^{name}:"):
        TrainConfig(**kw)


_FLOAT_FIELDS = [n for n, (_, hi, _) in LIMITS.items() if isinstance(hi, float)]
_INT_FIELDS = [n for n in LIMITS if n not in _FLOAT_FIELDS]


@given(name=st.sampled_from(_FLOAT_FIELDS), value=st.floats())
def test_train_config_floats_are_finite_and_in_range(name, value):
    lo, hi, lo_open = LIMITS[name]
    try:
        c = TrainConfig(**{name: value})
    except UsageError as exc:
        assert name in str(exc)
        return
    v = getattr(c, name)
    assert math.isfinite(v) and (lo < v if lo_open else lo <= v) and v <= hi


@given(name=st.sampled_from(_INT_FIELDS), value=st.integers(-2**70, 2**70))
def test_train_config_ints_are_in_range(name, value):
    lo, hi, _ = LIMITS[name]
    try:
        c = TrainConfig(**{name: value})
    except UsageError as exc:
        assert name in str(exc)
        return
    assert lo <= getattr(c, name) <= hi


@pytest.mark.parametrize("kw, name", [
    (dict(toml_values={"gamma": {"a": 1}}), "gamma"),
    (dict(toml_values=[("gamma", 0.9)]), "--config"),
    (dict(toml_values={"algo": ["ppo"]}), "algo"),
    (dict(toml_values={"env_id": 3}), "env_id"),
    (dict(overrides={"learning-rate": 0.1}), "did you mean 'learning_rate'"),
    (dict(flags={"n_envs": 0}), "--num-envs (n_envs)"),
    (dict(flags={"seed": 2**63}), "--seed (seed)"),
    (dict(env_id=""), "env_id"),
    (dict(overrides={"gamma": 10**400}), "gamma"),
])
def test_resolve_config_names_the_key(kw, name):
    with pytest.raises(UsageError) as exc:
        resolve_config(**kw)
    assert name in str(exc.value)


def _llm_limits():
    from ppokit.llm.training.config import LIMITS as LLM_LIMITS

    return LLM_LIMITS


@given(data=st.data())
def test_llm_config_fields_are_finite_and_in_range(data):
    from ppokit.llm.training.config import LLMConfig

    limits = _llm_limits()
    name = data.draw(st.sampled_from(sorted(limits)))
    integer, lo, hi, lo_open = limits[name]
    value = data.draw(st.integers(-2**70, 2**70) if integer else st.floats())
    base = dict(batch_size=1, grad_accum=1)
    if name == "lora_r" and value > 0:
        return  # needs peft; checked elsewhere
    try:
        cfg = LLMConfig(**{**base, name: value}).resolved()
    except UsageError as exc:
        assert name in str(exc), str(exc)
        return
    v = getattr(cfg, name)
    if name == "time_limit":
        assert v is None or math.isfinite(v)
    else:
        assert (lo < v if lo_open else lo <= v) and v <= hi


def test_llm_config_every_field_has_a_rule():
    from ppokit.core.options import OPTION_TABLES  # checked against the parts' declarations
    from ppokit.llm.training.config import CHOICES, FLAGS_BOOL, PATHS, SPECIAL, LLMConfig

    ruled = (set(_llm_limits()) | set(CHOICES) | set(PATHS) | set(FLAGS_BOOL) | {"algo"}
             | set(SPECIAL) | set(OPTION_TABLES))
    assert {f.name for f in fields(LLMConfig)} == ruled


@pytest.mark.parametrize("call, name", [
    ("sft_train", dict(steps=0)), ("sft_train", dict(batch_size=0)),
    ("sft_train", dict(lr=math.inf)), ("sft_train", dict(seed=-1)),
    ("sft_train", dict(weight_decay=math.nan)),
    ("train_reward_model", dict(lr=math.inf)), ("train_reward_model", dict(epochs=0)),
    ("train_reward_model", dict(batch_size=-1)), ("train_reward_model", dict(pairs=[])),
    ("dpo_train", dict(beta=math.nan)), ("dpo_train", dict(beta=-1.0)),
    ("dpo_train", dict(lr=0.0)), ("dpo_train", dict(epochs=1.5)),
    ("dpo_train", dict(pairs=[{"prompt": 1}])),
    ("run_bench", dict(length=-1)), ("run_bench", dict(batch=0)),
    ("run_bench", dict(iterations=0)), ("run_bench", dict(algo="trpo")),
    ("run_bench", dict(precision="fp16")), ("run_bench", dict(rounds=0)),
])
def test_python_entry_points_name_the_argument(call, name):
    from ppokit.llm.evaluation.bench import run_bench
    from ppokit.llm.training.dpo import dpo_train
    from ppokit.llm.training.rm import train_reward_model
    from ppokit.llm.training.sft import sft_train

    kw = dict(name)
    (key, _), = kw.items()
    flag = {"pairs": "pairs", "weight_decay": "weight_decay"}.get(
        key, "--" + key.replace("_", "-"))
    pair = {"prompt": "p", "chosen": "a", "rejected": "b"}
    with pytest.raises(UsageError, match=flag):
        if call == "sft_train":
            sft_train(None, None, None, **kw)  # refused before the model is touched
        elif call == "run_bench":
            run_bench(**kw)
        else:
            pairs = kw.pop("pairs", [pair])
            fn = train_reward_model if call == "train_reward_model" else dpo_train
            fn(None, None, pairs, [pair], **kw)


def test_non_finite_weights_are_refused():
    import torch

    from ppokit.llm.training.guards import check_finite_model

    lin = torch.nn.Linear(3, 2)
    check_finite_model(lin, "sft")
    with torch.no_grad():
        lin.bias[1] = float("nan")
    with pytest.raises(UsageError, match=r"^dpo: .*1 of 8 values .*first in bias"):
        check_finite_model(lin, "dpo")


def test_sft_refuses_to_return_non_finite_weights(tiny_model_dir):
    import torch

    from ppokit.llm.inputs.task import ReverseTask
    from ppokit.llm.modeling.models import load_lm
    from ppokit.llm.training.sft import builtin_sft

    model, tok = load_lm(str(tiny_model_dir))
    with torch.no_grad():
        next(model.parameters()).fill_(float("nan"))
    with pytest.raises(UsageError, match="^sft: training produced non-finite weights"):
        builtin_sft(ReverseTask(), model, tok, steps=1, batch_size=2)


def _llm_args(argv: list[str]):
    import argparse

    from ppokit.llm.cli import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(argv)


@pytest.mark.parametrize("argv, flag", [
    (["sft", "--out", "o", "--steps", "0"], "--steps"),
    (["sft", "--out", "", "--steps", "5"], "--out"),
    (["rm", "--out", "o", "--prefer-longer", "2"], "--prefer-longer"),
    (["rm", "--out", "o", "--n-pairs", "1000000000"], "--n-pairs"),
    (["rm", "--out", "o", "--eval-frac", "0"], "--eval-frac"),
    (["dpo", "--out", "o", "--beta", "nan"], "--beta"),
    (["dpo", "--out", "o", "--n-pairs", "-3"], "--n-pairs"),
    (["bench", "--length", "-1"], "--length"),
    (["eval", "r", "--n-prompts", "0"], "--n-prompts"),
    (["eval", "r", "--temperature", "nan"], "--temperature"),
    (["eval", "r", "--seed", "-2"], "--seed"),
])
def test_llm_cli_args_checked_before_any_work(argv, flag):
    """``check_cli_args`` on a parsed ``ppokit llm`` namespace: what a command can call
    before it builds a model or generates pairs."""
    from ppokit.llm.training.guards import check_cli_args

    with pytest.raises(UsageError, match=f"^{flag}:"):
        check_cli_args(_llm_args(argv))


@pytest.mark.parametrize("cmd", [["sft", "--out", "o"], ["rm", "--out", "o"],
                                 ["dpo", "--out", "o"], ["bench"], ["eval", "r"],
                                 ["train"]])
def test_llm_cli_defaults_pass_the_checks(cmd):
    from ppokit.llm.training.guards import check_cli_args

    check_cli_args(_llm_args(cmd))
