"""`python -m gputopo` is the `gputopo` command."""

import sys

from gputopo.cli import main

sys.exit(main())
