"""`ppokit` under torchrun with one rank made to die: PPOKIT_TEST_DIE=RANK:ITERATION makes
that rank exit hard (status 17) at the start of that iteration (tests only)."""

import os
import sys

from ppokit.llm.training import trainer as _trainer

_rank, _at = (int(x) for x in os.environ["PPOKIT_TEST_DIE"].split(":"))
_orig = _trainer.TokenTrainer.train_iteration


def _dying(self, roll=None):
    if self.rank == _rank and self.iteration + 1 == _at:
        os._exit(17)
    return _orig(self, roll)


_trainer.TokenTrainer.train_iteration = _dying

if __name__ == "__main__":
    from ppokit.cli import main

    sys.exit(main(sys.argv[1:]))
