"""`python -m deviceplugin.nvml_probe`, the command the project's docs and device checks have
always named, kept working since the probe moved with the hardware modules: it runs
`deviceplugin.hardware.nvml_probe` (what the node's NVML reports, one line a GPU pair)."""

from __future__ import annotations

from deviceplugin.hardware.nvml_probe import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
