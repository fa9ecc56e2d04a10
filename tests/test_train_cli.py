"""`ppokit train / eval / plot` end to end on a tiny budget (in-process)."""

import json

from ppokit.cli import main
from ppokit.io import latest_checkpoint, read_metrics


def test_train_eval_plot(tmp_path, capsys):
    runs = []
    for seed in (0, 1):
        rd = tmp_path / f"run{seed}"
        rc = main(["train", "--total-steps", "2048", "--seed", str(seed), "--run-dir", str(rd),
                   "--set", "tensorboard=false", "--set", "checkpoint_every=3",
                   "--eval-episodes", "2", "--no-progress"])
        assert rc == 0
        out = capsys.readouterr().out.strip().splitlines()
        assert len(out) == 1 and "ppo on CartPole-v1: 2048 steps" in out[0]
        for name in ("config.json", "metrics.jsonl", "learning_curve.png", "eval.json"):
            assert (rd / name).exists(), name
        assert latest_checkpoint(rd / "checkpoints").name == "iter_000000008"
        assert len(read_metrics(rd)) == 8
        runs.append(rd)
    assert main(["eval", str(runs[0]), "--episodes", "3", "--seed", "5"]) == 0
    res = json.loads((runs[0] / "eval.json").read_text())
    assert res["episodes"] == 3 and len(res["returns"]) == 3
    assert res["mean_return"] > 0 and res["std_return"] >= 0
    # deterministic by default: the same seed gives the same returns
    assert main(["eval", str(runs[0]), "--episodes", "3", "--seed", "5"]) == 0
    assert json.loads((runs[0] / "eval.json").read_text())["returns"] == res["returns"]
    out_png = tmp_path / "curves.png"
    assert main(["plot", *map(str, runs), "--out", str(out_png)]) == 0
    assert out_png.stat().st_size > 1000
    # an existing run directory is not overwritten
    capsys.readouterr()
    assert main(["train", "--run-dir", str(runs[0]), "--total-steps", "2048"]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert main(["eval", str(tmp_path / "missing")]) == 2


def test_progress_bar_keeps_its_fields_at_80_columns(tmp_path):
    """The live bar on an 80-column terminal: every field visible (no '…'), time labelled
    as what is left."""
    import io
    import re

    from rich.console import Console

    from ppokit.algos import Trainer, resolve_config
    from ppokit.algos.progress import train_with_progress

    for width in (80, 132):
        buf = io.StringIO()
        con = Console(file=buf, width=width, force_terminal=True, color_system=None)
        cfg = resolve_config(overrides={"tensorboard": False, "n_envs": 2, "n_steps": 64,
                                        "batch_size": 64},
                             flags={"total_timesteps": 512})
        tr = Trainer(cfg, tmp_path / f"w{width}", log=lambda m: None)
        train_with_progress(tr, console=con)
        tr.close()
        last = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buf.getvalue()).split("\r")[-1].strip()
        assert "…" not in last and len(last) <= width, last
        assert last.endswith("left") and "kl " in last and "clip " in last
        assert ("ret " if width == 80 else "return ") in last
