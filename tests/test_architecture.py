"""The README's architecture picture is the one tools/architecture.py generates from the
import-linter contracts and the imports in the code (`make diagram` rewrites it)."""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("architecture", ROOT / "tools" / "architecture.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_picture_is_the_generated_one() -> None:
    arch = tool()
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    committed = readme[readme.index(arch.BEGIN) : readme.index(arch.END) + len(arch.END)]
    assert committed == arch.render(), "the README's architecture picture is out of date: run `make diagram`"


def test_the_picture_shows_every_package_layer_and_import() -> None:
    arch = tool()
    picture = arch.render()
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    for package in cfg["root_packages"]:
        assert f'    {package}["<b>{package}</b>' in picture
    layers = next(c for c in cfg["contracts"] if c["type"] == "layers")["layers"]
    assert picture.count("  subgraph layer") == len(layers)
    assert "  kubectl_gputopo --> gputopo_kube" in picture and "  deviceplugin --> gputopo_proto" in picture
    arrows = [line.split() for line in picture.splitlines() if " --> " in line and line.startswith("  ")]
    assert all(a[0] != "gputopo" for a in arrows), "the core imports no other package"
    assert ["scheduler", "-->", "deviceplugin"] not in arrows
    stale = arch.replace_in(f"intro\n{arch.BEGIN}\nold picture\n{arch.END}\nrest", picture)
    assert stale == f"intro\n{picture}\nrest"


def test_the_picture_shows_the_cores_subpackages_with_their_layers() -> None:
    arch = tool()
    picture = arch.render()
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    core = next(c for c in cfg["contracts"] if c["type"] == "layers" and c.get("containers") == ["gputopo"])
    rank: dict[str, int] = {}
    for k, layer in enumerate(core["layers"]):
        for name in (m.strip() for m in layer.split("|")):
            rank[name] = k
            assert f'    core_{name}["<b>gputopo.{name}</b><br/>' in picture
    assert {"node", "network", "pod", "gang", "sim"} <= set(rank)
    assert picture.count("  subgraph core") == len(core["layers"])
    arrows = [line.split() for line in picture.splitlines() if line.startswith("  core_") and " --> " in line]
    assert ["core_gang", "-->", "core_pod"] in arrows and ["core_network", "-->", "core_node"] in arrows
    for importer, _, imported in arrows:  # every drawn import runs down the layers
        assert rank[importer.removeprefix("core_")] < rank[imported.removeprefix("core_")]
