"""``python -m ssd`` is the ``ssd`` command (also what ``torchrun -m ssd train ...`` runs)."""

import sys

from ssd.cli import main

sys.exit(main())
