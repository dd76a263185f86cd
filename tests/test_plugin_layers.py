"""The device plugin's kubelet watcher drives its server, the server its servicers: neither the
server nor the servicers import the watcher, so the three form no (type) cycle. What they share
(RegistrationInfo, plugin_options) lives in deviceplugin.kubelet.api (issue 8 item 3).
Read from the real import graph (grimp, which import-linter builds on), imports under
TYPE_CHECKING included."""

from __future__ import annotations

import grimp
import pytest

#: Top to bottom: each may import those below it, never one above.
ORDER = (
    "deviceplugin.kubelet.registration",
    "deviceplugin.kubelet.server",
    "deviceplugin.kubelet.service",
    "deviceplugin.kubelet.api",
)


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(
        "deviceplugin", "gputopo_proto", "gputopo", cache_dir=None
    )  # the tree as it is now


def test_no_module_imports_one_above_it(graph: grimp.ImportGraph) -> None:
    for k, upper in enumerate(ORDER):
        for lower in ORDER[k + 1 :]:
            chain = graph.find_shortest_chain(importer=lower, imported=upper)
            assert chain is None, f"{lower} imports {upper}: {' -> '.join(chain or ())}"


def test_the_graph_sees_the_imports_that_go_down(graph: grimp.ImportGraph) -> None:
    """Guards the test above: the downward imports are there, the TYPE_CHECKING one included."""
    assert graph.direct_import_exists(
        importer="deviceplugin.kubelet.registration", imported="deviceplugin.kubelet.server"
    )
    assert graph.direct_import_exists(
        importer="deviceplugin.kubelet.server", imported="deviceplugin.kubelet.service"
    )
    for module in ORDER[:-1]:
        assert graph.direct_import_exists(importer=module, imported="deviceplugin.kubelet.api")
