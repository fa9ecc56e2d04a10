"""``ppokit llm train --nproc N``: the same command on N local ranks, supervised.

The launcher runs torchrun's launcher (``torch.distributed.run``: ``--standalone``, N
processes of this machine) in its own process, so the ranks are its children:

* a SIGINT or SIGTERM to the launcher is forwarded by torchrun to every rank once (each
  rank runs in a session of its own, so a Ctrl-C at the terminal reaches only the
  launcher); the ranks agree to stop at the same iteration, rank 0 writes the checkpoint
  and prints the command that resumes, and the launcher ends with 130 / 143. torchrun
  waits ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` seconds (set here to an hour unless given) for
  that before it kills the ranks; a second signal stops them at once (the last complete
  checkpoint stays intact);
* the ranks end with the launcher however it ends (``kill -9`` included): each follows the
  launcher's pid (:mod:`ppokit.supervise`) and, when it dies, stops as at a first SIGTERM:
  a checkpoint at the iteration boundary, then 143.
"""

from __future__ import annotations

import os
import signal
import sys

__all__ = ["launch"]

SHUTDOWN_TIMEOUT_S = 3600


def launch(nproc: int, argv: list[str]) -> int:
    """Run ``ppokit ARGV`` (without ``--nproc``) on ``nproc`` ranks; the exit status."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    from ppokit.io.signals import signal_name
    from ppokit.supervise import ENV, supervisor_token

    print(f"launching: torchrun --standalone --nproc_per_node={nproc} -m ppokit "
          + " ".join(argv), file=sys.stderr, flush=True)
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    os.environ[ENV] = supervisor_token()  # the ranks follow this process
    os.environ.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(SHUTDOWN_TIMEOUT_S))
    try:
        run(parse_args(["--standalone", f"--nproc_per_node={nproc}", "-m", "ppokit", *argv]))
    except SignalException as exc:
        signum = int(exc.sigval)
        print(f"ppokit llm train: stopped by {signal_name(signum)}; the ranks were told to "
              "write a checkpoint and stop (rank 0 printed the command that resumes)",
              file=sys.stderr, flush=True)
        return 128 + signum
    except ChildFailedError as exc:
        codes = [f.exitcode for f in exc.failures.values()]
        rc = next((c for c in codes if c > 0), 1)
        print(f"ppokit llm train: the {nproc}-process job failed (exit status {rc}); the "
              "first failing rank's error is above. Checkpoints are written atomically by "
              "rank 0: the last one in the run directory is intact and --resume continues "
              "from it.", file=sys.stderr, flush=True)
        return rc
    finally:
        os.environ.pop(ENV, None)
        for s, h in old.items():
            signal.signal(s, h)
    return 0
