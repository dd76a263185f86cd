"""`python -m gputopo.sim`: the simulate command on its own."""

import sys

from gputopo.sim.cli import main

sys.exit(main())
