"""``python -m ppokit`` (and ``torchrun ... -m ppokit llm train ...``): the ``ppokit``
command."""

import sys

from ppokit.cli import main

sys.exit(main())
