"""`python -m kubectl_gputopo`, the same as the `kubectl-gputopo` console script."""

import sys

from kubectl_gputopo.cli import main

sys.exit(main())
