"""The ``ppokit`` command line.

Each subcommand lives in its own module, imported only when that subcommand runs (so
``ppokit --help`` and light commands start fast). A command module exposes
``add_arguments(parser)`` and ``run(args) -> int``. A :class:`ppokit.errors.UsageError`
or ``ValueError`` raised by a command ends the process with status 2 and a one-line
message naming what was wrong.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("ppokit.demos.cli",
             "run the worked experiments (GAE, clip, bandit, KL, ...) and print their figures"),
    "llm": ("ppokit.llm.cli", "token-level RLHF on language models (train, eval, sft, rm, dpo)"),
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
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    # Two-stage parse: find the command, then let its module add its own arguments.
    if argv and argv[0] in COMMANDS:
        name = argv[0]
        module = importlib.import_module(COMMANDS[name][0])
        sub = _Parser(prog=f"ppokit {name}", description=COMMANDS[name][1])
        module.add_arguments(sub)
        args = sub.parse_args(argv[1:])
        try:
            return int(module.run(args) or 0)
        except ValueError as exc:  # UsageError is a ValueError
            print(f"ppokit {name}: error: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print(f"ppokit {name}: interrupted", file=sys.stderr)
            return 130
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
