"""The ``ppokit`` command line.

Each subcommand lives in its own module, imported only when that subcommand runs (so
``ppokit --help`` and light commands start fast). A command module exposes
``add_arguments(parser)`` and ``run(args) -> int``. A :class:`ppokit.errors.UsageError`
or ``ValueError`` raised by a command ends the process with status 2 and a one-line
message naming what was wrong; a :class:`ppokit.errors.Fault` (a full disk, a file-size
limit) with status 74 and one line naming the path. ``--debug`` (anywhere on the line, or
``PPOKIT_DEBUG=1``) also prints the traceback behind such a line: the user's own code's
(an environment's, a reward function's) when it raised.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("ppokit.demos.cli",
             "run the worked experiments (GAE, clip, bandit, KL, ...) and print their figures"),
    "llm": ("ppokit.llm.cli", "token-level RLHF on language models (train, compare, eval, "
            "sft, rm, dpo, fetch, bench)"),
    "train": ("ppokit.commands.train", "train an agent on a Gymnasium environment"),
    "tune": ("ppokit.commands.tune",
             "hyperparameter search with Optuna (trials local or as Ray tasks)"),
    "eval": ("ppokit.commands.eval", "evaluate a trained run's policy, write eval.json"),
    "plot": ("ppokit.commands.plot", "overlay learning curves of runs"),
    "report": ("ppokit.diagnose.cli", "read a run's metrics and name what looks wrong"),
    "check": ("ppokit.checks.cli", "pre-flight checks of a policy, an environment or a "
              "language-model run"),
}


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (exit 2), like every other bad input."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="ppokit",
        description="Policy-gradient reinforcement learning centred on PPO.",
    )
    from ppokit import __version__

    parser.add_argument("--version", action="version", version=f"ppokit {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="after a one-line error, also print the traceback behind it "
                             "(your environment's or reward function's own, when it raised); "
                             "allowed anywhere on the line, same as PPOKIT_DEBUG=1")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
    return parser


def _one_line(name: str, exc: BaseException, status: int) -> int:
    """Print ``exc`` as the command's one error line (its traceback first with --debug:
    the user's code's when it raised) and return ``status``."""
    from ppokit.errors import debug_enabled

    if debug_enabled():
        import traceback

        shown = exc.__cause__ if exc.__cause__ is not None else exc
        traceback.print_exception(shown, file=sys.stderr)
    text = " ".join(str(exc).split("\n"))  # one line, whatever a message holds
    print(f"ppokit {name}: error: {text}", file=sys.stderr, flush=True)
    return status


def _run_command(name: str, module, args) -> int:
    from ppokit.errors import FAULT_EXIT, WRITE_FAULTS, Fault, write_fault

    try:
        return int(module.run(args) or 0)
    except Fault as exc:
        return _one_line(name, exc, exc.exit_code)
    except ValueError as exc:  # UsageError is a ValueError
        return _one_line(name, exc, 2)
    except OSError as exc:
        if exc.errno not in WRITE_FAULTS:
            raise
        fault = write_fault(exc, exc.filename or "a file")
        fault.__cause__ = exc
        return _one_line(name, fault, FAULT_EXIT)
    except KeyboardInterrupt:
        print(f"ppokit {name}: interrupted", file=sys.stderr)
        return 130


from ppokit import supervise  # noqa: E402
from ppokit.supervise import stop_by_signal  # noqa: E402,F401 (re-exported)


def _terminate(signum, frame) -> None:
    """SIGTERM outside training (which checkpoints first): end like Ctrl-C does, through
    the cleanup that undoes a start not finished (a run directory half made is removed)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    stop_by_signal(signum)


def _thread_fault_hook(args) -> None:
    """A full disk in a helper thread (TensorBoard's writer) is not printed as a traceback:
    the thread's owner raises it again in the main thread, which says it in one line."""
    from ppokit.errors import WRITE_FAULTS

    if isinstance(args.exc_value, OSError) and args.exc_value.errno in WRITE_FAULTS:
        return
    threading.__excepthook__(args)


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the process is ours (not a test's, nor a Ray task's)
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _terminate)
        threading.excepthook = _thread_fault_hook
        try:
            return _main_own(argv)
        finally:
            supervise.ENDING.set()  # a signal from now on ends the process quietly (stop_by_signal)
    return _main_own(argv)


def _main_own(argv: list[str] | None) -> int:
    own = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--debug" not in argv:
        try:
            return _main(argv)
        except BrokenPipeError:  # `ppokit report RUN | head`: the reader stopped reading
            if not own:
                raise
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes
            return 141  # 128 + SIGPIPE, as a shell reports it
    # anywhere on the line; for this command and the processes it starts (torchrun's ranks)
    old = os.environ.get("PPOKIT_DEBUG")
    os.environ["PPOKIT_DEBUG"] = "1"
    try:
        return _main([a for a in argv if a != "--debug"])
    finally:  # (a caller in the same process, a test, keeps its own setting)
        if old is None:
            os.environ.pop("PPOKIT_DEBUG", None)
        else:
            os.environ["PPOKIT_DEBUG"] = old


def _main(argv: list[str]) -> int:
    from ppokit.supervise import follow_supervisor

    follow_supervisor()  # a process started by a ppokit launcher ends with it
    parser = build_parser()
    # Two-stage parse: find the command, then let its module add its own arguments.
    if argv and argv[0] in COMMANDS:
        name = argv[0]
        module = importlib.import_module(COMMANDS[name][0])
        sub = _Parser(prog=f"ppokit {name}", description=COMMANDS[name][1])
        module.add_arguments(sub)
        args = sub.parse_args(argv[1:])
        return _run_command(name, module, args)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
