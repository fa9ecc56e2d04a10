"""``ppokit eval RUN_DIR``: play the saved policy and write RUN_DIR/eval.json
(``--stochastic``: eval_stochastic.json, so the deterministic result stays; ``--best``: the
best/ policy of the evaluations during training, eval_best.json; ``--video DIR``: an MP4 of
each episode in DIR, with DIR/video.json, see :mod:`ppokit.algos.video`; ``--opponent``: a
self-play run's games against one opponent, eval_opponent.json, see
:mod:`ppokit.algos.opponent_eval`)."""

from __future__ import annotations

import argparse
import json

from ppokit.cliutil import int_arg as _int
from ppokit.errors import UsageError

MAX_EPISODES = 10**6  # as ppokit train --eval-episodes and Agent.evaluate


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--episodes", type=_int, default=10,
                   help="episodes to play (default 10, at most 1000000)")
    p.add_argument("--seed", type=_int, default=None,
                   help="first episode seed (default: the run's seed + 1000000)")
    p.add_argument("--env", dest="env_id", metavar="MODULE:ID",
                   help="the run's environment id again; required for a run trained on a "
                        "module:Id (its module is imported only because you name it here)")
    p.add_argument("--best", action="store_true",
                   help="evaluate the best policy the evaluations during training kept "
                        "(best/, eval_every > 0); writes eval_best.json")
    p.add_argument("--stochastic", action="store_true",
                   help="sample actions instead of taking the most likely / mean action; "
                        "writes eval_stochastic.json instead of eval.json")
    p.add_argument("--opponent", metavar="SPEC", default=None,
                   help="a self-play run (selfplay = true): play --episodes games, seats "
                        "alternating, against random, heuristic (one-step lookahead), "
                        "snapshot:N (the run's snapshot after iteration N) or RUN2 (another "
                        "run of the same game); prints win/draw/loss rates with 95%% Wilson "
                        "intervals and writes eval_opponent.json")
    p.add_argument("--video", metavar="DIR", default=None,
                   help="also write an MP4 of each episode (the same seeds and policy) into "
                        "DIR, created if missing, with DIR/video.json; needs the video extra "
                        "(pip install 'ppokit[video]')")


def run(args: argparse.Namespace) -> int:
    from ppokit.algos.config import SEED_MAX
    from ppokit.algos.evaluate import evaluate_run
    from ppokit.io.atomic import atomic_write_text
    from ppokit.io.rundir import check_run_dir, is_llm_run_dir

    if not 1 <= args.episodes <= MAX_EPISODES:
        raise UsageError(f"--episodes: expected an integer in [1, {MAX_EPISODES}], got "
                         f"{args.episodes}")
    if args.seed is not None and not 0 <= args.seed <= SEED_MAX:
        raise UsageError(f"--seed: expected an integer in [0, {SEED_MAX}], got {args.seed}")
    run_dir = check_run_dir(args.run_dir)
    if is_llm_run_dir(run_dir):
        raise UsageError(f"{run_dir} is a language-model run: evaluate it with `ppokit llm "
                         f"eval {run_dir}` (naming its --reward again if it was trained "
                         "with a reward function, an agent run's --env module:Id and "
                         "--tools)")
    if args.video is not None:
        from ppokit.algos.video import check_video_dir, require_video_extra

        check_video_dir(args.video)
        require_video_extra()
        # rgb_array rendering needs no display; without one SDL (pygame) would print a
        # warning about XDG_RUNTIME_DIR. This process only renders into arrays.
        import os

        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    from ppokit.io import RunLock

    if args.opponent is not None:
        return _versus(args, run_dir)
    with RunLock(run_dir, "eval"):
        res = evaluate_run(run_dir, episodes=args.episodes, seed=args.seed,
                           deterministic=not args.stochastic, env=args.env_id,
                           best=args.best, video=args.video)
        video = res.pop("video", None)
        name = ("eval_best" if args.best else "eval") + \
            ("_stochastic.json" if args.stochastic else ".json")
        atomic_write_text(run_dir / name, json.dumps(res, indent=2) + "\n")
    kind = "stochastic" if args.stochastic else "deterministic"
    kind += " (best/ policy)" if args.best else ""
    print(f"{res['env_id']}: mean return {res['mean_return']:.2f} ± {res['std_return']:.2f} "
          f"over {res['episodes']} {kind} episodes (seed {res['seed']})")
    if video is not None:
        print(f"videos: {len(video['files'])} MP4 files in {video['dir']} "
              f"({video['files'][0]} ...; returns in video.json)")
    return 0


def _versus(args: argparse.Namespace, run_dir) -> int:
    """``--opponent``: the run's games against one opponent (:mod:`ppokit.algos.opponent_eval`)."""
    from ppokit.algos.opponent_eval import evaluate_versus, summary
    from ppokit.io import RunLock
    from ppokit.io.atomic import atomic_write_text

    for flag in ("best", "video"):
        if getattr(args, flag) not in (None, False):
            raise UsageError(f"--{flag}: does not go with --opponent")
    with RunLock(run_dir, "eval"):
        res = evaluate_versus(run_dir, args.opponent, games=args.episodes, seed=args.seed,
                              stochastic=args.stochastic)
        atomic_write_text(run_dir / "eval_opponent.json", json.dumps(res, indent=2) + "\n")
    print(summary(res))
    return 0
