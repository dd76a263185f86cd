"""`python -m deviceplugin.dra`: the same as `python -m deviceplugin --mode dra`, the DRA node
daemon. Its settings are the one table's (deviceplugin/settings.py, `--help` lists them), its
start the one start path (deviceplugin/startup.py), exit codes as in device-plugin mode."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from deviceplugin.dra.mode import MODE
from deviceplugin.startup import run


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    return run(MODE, list(sys.argv[1:] if argv is None else argv), os.environ if environ is None else environ)


if __name__ == "__main__":
    sys.exit(main())
