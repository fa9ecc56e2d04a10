"""`--track wandb`: every metrics record reaches W&B (offline, no account), a resumed run
continues the same W&B run, and a missing package or a bad project name is a one-line
error before any work."""

import json
import sys

import pytest

from ppokit.cli import main
from ppokit.io import read_metrics

wandb = pytest.importorskip("wandb", reason="the wandb extra (make test installs it)")

TRAIN = ["train", "--total-steps", "2048", "--set", "n_envs=4", "--set", "n_steps=64",
         "--set", "tensorboard=false", "--eval-episodes", "0", "--no-progress"]


@pytest.fixture
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))


def test_offline_run_holds_every_metric_and_resume_continues_it(offline, tmp_path, capsys):
    rd = tmp_path / "run"
    assert main([*TRAIN, "--track", "wandb", "--run-dir", str(rd),
                 "--set", "checkpoint_every=2"]) == 0
    run_id = (rd / "wandb_id").read_text().strip()
    files = list((rd / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    assert len(files) == 1
    data = files[0].read_bytes()
    recs = read_metrics(rd)
    assert len(recs) == 8
    for key in ("episode_return_mean", "policy_loss", "approx_kl", "global_step"):
        assert f"train/{key}".encode() in data or key == "global_step", key
    assert json.loads((rd / "config.json").read_text())["track"] == "wandb"
    # the resumed run logs to the same W&B run id (a second offline segment of it)
    assert main(["train", "--resume", str(rd), "--no-progress", "--eval-episodes", "0"]) == 0
    assert (rd / "wandb_id").read_text().strip() == run_id
    assert len(list((rd / "wandb").glob(f"offline-run-*-{run_id}"))) >= 1


def test_every_record_is_logged_at_its_step(monkeypatch, tmp_path):
    """The records W&B receives are metrics.jsonl's numeric fields, under train/, at each
    record's global_step (wandb.init replaced by a recorder; the real package is imported)."""
    logged, inits = [], []

    class Recorder:
        def log(self, scalars, step):
            logged.append((step, scalars))

        def finish(self):
            logged.append("finished")

    def fake_init(**kw):
        inits.append(kw)
        return Recorder()

    monkeypatch.setattr(wandb, "init", fake_init)
    rd = tmp_path / "run"
    assert main([*TRAIN, "--track", "wandb", "--run-dir", str(rd),
                 "--set", "wandb_project=my-proj"]) == 0
    recs = read_metrics(rd)
    assert logged[-1] == "finished" and len(logged) == len(recs) + 1
    for rec, (step, scalars) in zip(recs, logged[:-1]):
        assert step == rec["global_step"]
        numeric = {f"train/{k}": v for k, v in rec.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
        assert scalars == numeric
    (kw,) = inits
    assert kw["project"] == "my-proj" and kw["dir"] == str(rd)
    assert kw["id"] == (rd / "wandb_id").read_text().strip()
    assert kw["config"]["track"] == "wandb"

    # resume: the same id again
    inits.clear()
    assert main(["train", "--resume", str(rd), "--no-progress", "--eval-episodes", "0"]) == 0
    assert [i["id"] for i in inits] == [kw["id"]]


def test_missing_wandb_is_a_one_line_error_and_leaves_nothing(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    rd = tmp_path / "run"
    assert main([*TRAIN, "--track", "wandb", "--run-dir", str(rd)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "track: wandb is not installed" in err[0]
    assert not rd.exists()


@pytest.mark.parametrize("name", ["", "a b", "x" * 129, "proj/../x"])
def test_bad_project_name(name, tmp_path, capsys):
    assert main([*TRAIN, "--run-dir", str(tmp_path / "r"), "--set",
                 f"wandb_project={name}"]) == 2
    assert "wandb_project" in capsys.readouterr().err


def test_a_damaged_id_file_starts_a_new_wandb_run(monkeypatch, tmp_path, capsys):
    """The id file is data: a value outside W&B's id alphabet is never passed on."""
    inits = []

    class Recorder:
        def log(self, scalars, step):
            pass

        def finish(self):
            pass

    monkeypatch.setattr(wandb, "init", lambda **kw: inits.append(kw) or Recorder())
    rd = tmp_path / "run"
    assert main([*TRAIN, "--track", "wandb", "--run-dir", str(rd)]) == 0
    (rd / "wandb_id").write_text("../../elsewhere\n")
    capsys.readouterr()
    assert main(["train", "--resume", str(rd), "--no-progress", "--eval-episodes", "0"]) == 0
    assert "no valid W&B run id" in capsys.readouterr().err
    new_id = inits[-1]["id"]
    assert new_id != "../../elsewhere" and new_id.isalnum()
    assert (rd / "wandb_id").read_text().strip() == new_id


def test_a_wandb_that_cannot_start_is_a_one_line_error(monkeypatch, tmp_path, capsys):
    def no_login(**kw):
        raise RuntimeError("api_key not configured (no-tty)\nmore lines")

    monkeypatch.setattr(wandb, "init", no_login)
    rd = tmp_path / "run"
    assert main([*TRAIN, "--track", "wandb", "--run-dir", str(rd)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "track: W&B could not start a run" in err[0]
    assert "WANDB_MODE=offline" in err[0] and not rd.exists()
