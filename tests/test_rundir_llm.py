"""Run directories you can trust (language-model runs): a run directory runs no code and
reads nothing outside itself, checkpoints survive a crash at every step of their write,
resume refuses or falls back as environment runs do, one writer at a time, no hub."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from pathlib import Path

import pytest

from _faults import _count_and_crash, _Crash, _snapshot, count_write_steps
from ppokit.cli import main
from ppokit.errors import UsageError
from ppokit.io import GracefulStop, Interrupted, latest_checkpoint, read_metrics
from ppokit.llm.evaluation.evaluate import evaluate_lm_run
from ppokit.llm.modeling.models import build_char_tokenizer, build_tiny_model
from ppokit.llm.training.trainer import LLMConfig, TokenTrainer

REWARD = "ppokit.llm.inputs.task:reverse_score"


def _prompts(tmp_path: Path) -> Path:
    pf = tmp_path / "prompts.jsonl"
    pf.write_text("".join(json.dumps({"prompt": f"{i}{i + 1}>"}) + "\n" for i in range(8)))
    return pf


def _trainer(run_dir, **kw) -> TokenTrainer:
    tok = build_char_tokenizer()
    base = {"prompts_per_iter": 4, "iterations": 2, "checkpoint_every": 1}
    base.update(kw)
    return TokenTrainer(LLMConfig(**base), str(run_dir), policy=build_tiny_model(tok, seed=0),
                        tokenizer=tok, log=lambda *a: None)


def _trained(tmp_path, name="run", **kw) -> Path:
    tr = _trainer(tmp_path / name, **kw)
    tr.train(progress=False)
    tr.close()
    return tmp_path / name


def _rewrite_config(ck: Path, *, drop: tuple[str, ...] = (), **changes) -> None:
    """Edit a checkpoint's saved configuration *and* its manifest consistently — what an
    attacker who hands over a run directory can do (``drop``: keys removed, as in a run
    saved before they existed)."""
    state = json.loads((ck / "state.json").read_text())
    state["config"].update(changes)
    for k in drop:
        del state["config"][k]
    data = json.dumps(state).encode()
    (ck / "state.json").write_bytes(data)
    m = json.loads((ck / "manifest.json").read_text())
    m["files"]["state.json"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (ck / "manifest.json").write_text(json.dumps(m))


def test_a_run_directory_naming_code_runs_nothing(tmp_path, capsys):
    pf = _prompts(tmp_path)
    rd = _trained(tmp_path, prompts=str(pf), reward=REWARD)
    marker = tmp_path / "MARKER"
    evil = tmp_path / "evil_prompts.txt"
    evil.write_text(f"sh\n-c\ntouch {marker}\n")
    ck = latest_checkpoint(rd / "checkpoints")
    _rewrite_config(ck, reward="pty:spawn", eval_prompts=str(evil), prompts=str(evil))
    cfg = json.loads((rd / "config.json").read_text())
    cfg.update(reward="pty:spawn", eval_prompts=str(evil))
    (rd / "config.json").write_text(json.dumps(cfg))
    before = _snapshot(rd)
    capsys.readouterr()
    for argv in (["llm", "eval", str(rd)], ["llm", "train", "--resume", str(rd),
                                              "--no-progress", "--no-eval"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert "--reward" in err and "pty:spawn" in err and len(err.splitlines()) == 1
        assert not marker.exists()
        assert _snapshot(rd) == before
    # named again on the command line, the reward is the user's; the prompts are the run's
    # own copy, never the file the configuration names
    assert main(["llm", "eval", str(rd), "--reward", REWARD, "--n-prompts", "2"]) == 0
    assert not marker.exists()
    ev = json.loads((rd / "eval.json").read_text())
    assert ev["samples"] and all(s["prompt"].endswith(">") for s in ev["samples"])


def test_reward_model_path_in_a_run_is_not_loaded(tmp_path, capsys):
    rd = _trained(tmp_path)
    ck = latest_checkpoint(rd / "checkpoints")
    _rewrite_config(ck, reward_model=str(tmp_path / "somewhere"))
    capsys.readouterr()
    assert main(["llm", "eval", str(rd)]) == 2
    assert "--reward-model" in capsys.readouterr().err


def test_policy_link_is_replaced_not_written_through(tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("mine")
    rd = tmp_path / "run"
    rd.mkdir()
    (rd / "policy").symlink_to(foreign, target_is_directory=True)
    tr = _trainer(rd, iterations=1)
    tr.train(progress=False)
    tr.close()
    assert sorted(p.name for p in foreign.iterdir()) == ["keep.txt"]
    assert (rd / "policy").is_dir() and not (rd / "policy").is_symlink()
    assert (rd / "policy" / "config.json").exists()


def test_links_inside_reference_are_refused(tmp_path, capsys):
    rd = _trained(tmp_path)
    secret = tmp_path / "secret.json"
    secret.write_text("{}")
    (rd / "reference" / "tokenizer_config.json").unlink()
    (rd / "reference" / "tokenizer_config.json").symlink_to(secret)
    capsys.readouterr()
    assert main(["llm", "eval", str(rd)]) == 2
    assert "symbolic link" in capsys.readouterr().err


def test_a_model_name_is_never_looked_up_on_a_hub(tmp_path, capsys):
    t0 = time.time()
    assert main(["llm", "train", "--model", "gpt2", "--run-dir", str(tmp_path / "r"),
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--model" in err and "never downloads" in err
    assert time.time() - t0 < 20 and not (tmp_path / "r").exists()


def test_resume_cannot_change_the_run_configuration(tmp_path, capsys):
    rd = _trained(tmp_path)
    before = _snapshot(rd)
    capsys.readouterr()
    assert main(["llm", "train", "--resume", str(rd), "--algo", "grpo", "--no-progress"]) == 2
    assert "--algo" in capsys.readouterr().err
    assert _snapshot(rd) == before


def test_a_run_saved_before_kl_estimator_resumes_with_the_k3_it_trained_with(tmp_path):
    """kl_estimator's default is k2; a run whose configuration predates the field trained
    its KL loss with k3 and goes on with it."""
    from ppokit.llm.training.runfiles import config_from_run

    rd = _trained(tmp_path, algo="grpo", iterations=1, samples_per_prompt=2)
    assert config_from_run(str(rd)).kl_estimator == "k2"
    _rewrite_config(latest_checkpoint(rd / "checkpoints"), drop=("kl_estimator",))
    assert config_from_run(str(rd)).kl_estimator == "k3"


def test_llm_resume_refuses_without_an_intact_checkpoint_and_falls_back(tmp_path, capsys):
    rd = _trained(tmp_path, iterations=2, checkpoint_every=1)
    cks = sorted((rd / "checkpoints").iterdir())
    assert [c.name for c in cks] == ["iter_000000001", "iter_000000002"]
    (cks[1] / "policy.safetensors").write_bytes(b"torn")
    tr = TokenTrainer(LLMConfig(prompts_per_iter=4, iterations=3, checkpoint_every=1),
                      str(rd), resume=True, log=lambda *a: None)
    assert tr.iteration == 1 and (rd / "checkpoints" / "damaged-iter_000000002").is_dir()
    tr.train(progress=False)
    tr.close()
    assert [r["iteration"] for r in read_metrics(rd)] == [1, 2, 3]
    for c in (rd / "checkpoints").iterdir():
        if c.name.startswith("iter_"):
            (c / "optimizer.safetensors").write_bytes(b"torn")
    before = _snapshot(rd)
    with pytest.raises(UsageError, match="no intact checkpoint"):
        TokenTrainer(LLMConfig(prompts_per_iter=4, iterations=5), str(rd), resume=True,
                     log=lambda *a: None)
    assert _snapshot(rd) == before


def test_llm_run_crashed_at_every_step_of_a_checkpoint_write_resumes(tmp_path, monkeypatch):
    # how many file-system steps one checkpoint write takes
    probe = _trainer(tmp_path / "probe", iterations=1)
    probe.train_iteration()
    steps = count_write_steps(monkeypatch, probe.save_checkpoint)
    probe.close()
    assert steps >= 8
    for k in range(1, steps + 1):
        rd = tmp_path / f"crash{k}"
        tr = _trainer(rd, iterations=2, checkpoint_every=1)
        tr.train_iteration()
        tr.save_checkpoint()  # checkpoint 1 written normally
        tr.train_iteration()
        _count_and_crash(monkeypatch, k)
        with pytest.raises(_Crash):
            tr.save_checkpoint()  # dies inside checkpoint 2
        monkeypatch.undo()
        tr.close()
        again = TokenTrainer(LLMConfig(prompts_per_iter=4, iterations=3, checkpoint_every=1),
                             str(rd), resume=True, log=lambda *a: None)
        assert again.iteration in (1, 2), k
        again.train(progress=False)
        again.close()
        assert [r["iteration"] for r in read_metrics(rd)] == [1, 2, 3], k


def test_one_writer_at_a_time_and_a_signal_checkpoints(tmp_path):
    tr = _trainer(tmp_path / "run", iterations=5, checkpoint_every=100)
    with pytest.raises(UsageError, match="in use by pid"):
        _trainer(tmp_path / "run")
    with pytest.raises(UsageError, match="in use by pid"):
        evaluate_lm_run(str(tmp_path / "run"))
    stop = GracefulStop()
    stop.signum = signal.SIGINT
    with pytest.raises(Interrupted) as exc:
        tr.train(progress=False, stop=stop)
    assert exc.value.exit_code == 130 and exc.value.iteration == 1
    assert latest_checkpoint(tmp_path / "run" / "checkpoints").name == "iter_000000001"
    # the lock went with the interrupted training: resuming works
    tr2 = TokenTrainer(LLMConfig(prompts_per_iter=4, iterations=2, checkpoint_every=100),
                       str(tmp_path / "run"), resume=True, log=lambda *a: None)
    tr2.train(progress=False)
    tr2.close()
    assert [r["iteration"] for r in read_metrics(tmp_path / "run")] == [1, 2]
    assert os.path.isdir(tmp_path / "run" / "policy")
