"""One start path for both plugin modes (issue 30 item 4): the device plugin and the DRA driver
take their settings from the one table, install the same signal handlers before anything answers,
and export the device-health gauges from their start (the DRA mode once had its own copy of
the start, without them until the first health change)."""

from __future__ import annotations

import gc
import shutil
import signal
import socket
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from deviceplugin import settings
from deviceplugin.dra.daemon import DraDaemon
from deviceplugin.dra.kubeapi import KubeDraApi
from deviceplugin.hardware.filebackend import FileBackend
from deviceplugin.kubelet.daemon import Daemon
from deviceplugin.settings import DRA, OPTIONS, ConfigError, PluginConfig, load_config
from gputopo.node import draslices
from gputopo.node.topofile import load_preset
from tests.dra_standins import resource_api
from tests.kubelet_fake import fake_kubelet, short_tmpdir

PRESET = "dgx1-v100"
UUIDS = [g.uuid for g in load_preset(PRESET).gpus]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@pytest.fixture
def folder() -> Iterator[Path]:
    path = short_tmpdir("st-")  # unix socket paths are short: not pytest's tmp_path
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# --- gauges from the start -------------------------------------------------------------------


def _assert_every_gpu_healthy_at_start(port: int) -> None:
    m = scrape(port)
    for i, uuid in enumerate(UUIDS):
        assert m[("gputopo_gpu_healthy", (("gpu", str(i)), ("uuid", uuid)))] == 1.0, i
    assert m[("gputopo_devices", (("health", "healthy"),))] == len(UUIDS)
    assert m[("gputopo_devices", (("health", "unhealthy"),))] == 0


def test_the_dra_daemon_exports_device_health_gauges_from_its_start(folder: Path) -> None:
    """Scraped over HTTP as soon as `start()` returns, before any health change (the snapshot is
    still the first): every GPU's series is there."""
    port = free_port()
    config = PluginConfig(
        node_name="node-a",
        topology=PRESET,
        registry_dir=str(folder / "registry"),
        plugins_dir=str(folder / "plugins"),
        sysfs=str(folder / "sys"),
        metrics_port=port,
    )
    with resource_api() as (_stand_in, api_client):
        # no health file: nothing the health loop sees can change a GPU's health
        daemon = DraDaemon(config, FileBackend(PRESET), KubeDraApi(api_client), registrar_poll_s=0.05)
        daemon.start()
        try:
            _assert_every_gpu_healthy_at_start(port)
            assert daemon.store is not None and daemon.store.current().version == 1
        finally:
            daemon.stop()


def test_the_device_plugin_exports_them_from_its_start_too(folder: Path) -> None:
    port = free_port()
    config = PluginConfig(kubelet_dir=str(folder), topology=PRESET, metrics_port=port)
    daemon = Daemon(config, FileBackend(PRESET))
    with fake_kubelet(folder):
        daemon.start()
        try:
            _assert_every_gpu_healthy_at_start(port)
            assert daemon.store is not None and daemon.store.current().version == 1
        finally:
            daemon.stop()


# --- the same signals, before anything answers -----------------------------------------------


def test_both_modes_install_the_same_signal_handlers_before_anything_answers(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whoever sees a port or a socket answer may send SIGTERM at once (kubelet, a probe, a
    rollout): the handlers must be there before the first one opens, or the process dies by the
    signal instead of stopping with 0. In process and without timing, as the scheduler's test
    does it: each listener's start checks the handlers, then plays SIGTERM arriving at that
    moment; both modes go through `python -m deviceplugin`'s own `main`."""
    import deviceplugin.__main__ as entry
    import deviceplugin.dra.kubeapi as kubeapi
    import deviceplugin.startup as startup
    from deviceplugin.dra.registrar import DraServer
    from deviceplugin.kubelet.server import PluginServer
    from deviceplugin.metrics import Metrics

    seen: list[tuple[str, str, str]] = []

    def sigterm_now(what: str) -> None:
        term, interrupt = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
        assert callable(term), f"{what} started before the SIGTERM handler was installed"
        assert interrupt is term, f"{what}: SIGINT is not handled as SIGTERM is"
        seen.append((what, term.__module__, term.__qualname__))
        term(signal.SIGTERM, None)

    def checked(what: str, start: Callable[[Any], None]) -> Callable[[Any], None]:
        def wrapped(self: Any) -> None:
            sigterm_now(what)
            start(self)

        return wrapped

    monkeypatch.setattr(Metrics, "serve", lambda self, port: sigterm_now("the metrics port"))
    monkeypatch.setattr(PluginServer, "start", checked("the plugin socket", PluginServer.start))
    monkeypatch.setattr(DraServer, "start", checked("the DRA sockets", DraServer.start))
    monkeypatch.setattr(startup, "_abandon_stragglers", lambda seconds: None)  # never _exit pytest
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    env = {"PATH": "/usr/bin:/bin"}
    try:
        with fake_kubelet(folder):
            code = entry.main(["--kubelet-dir", str(folder), "--topology", PRESET, "--publish", "false"], env)
        assert code == 0
        with resource_api() as (_stand_in, api_client):
            monkeypatch.setattr(kubeapi, "for_cluster", lambda kubeconfig=None: KubeDraApi(api_client))
            code = entry.main(
                ["--mode", "dra", "--node-name", "node-a", "--topology", PRESET,
                 "--registry-dir", str(folder / "registry"), "--plugins-dir", str(folder / "plugins"),
                 "--sysfs", str(folder / "sys")],
                env,
            )  # fmt: skip
        assert code == 0
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        gc.unfreeze()
    assert [what for what, _, _ in seen] == [
        "the metrics port",
        "the plugin socket",
        "the metrics port",
        "the DRA sockets",
    ]
    assert len({(module, name) for _, module, name in seen}) == 1, "both modes' handlers are one"
    assert seen[0][1:] == ("deviceplugin.startup", "stop_on_signals.<locals>.on_signal")


# --- DRA's settings are rows of the one table ------------------------------------------------

#: DRA mode's settings: (field, flag, environment variable, file key, text, the value it parses to)
DRA_SETTINGS = [
    ("driver_name", "--driver-name", "GPUTOPO_DRA_DRIVER", "draDriverName", "gpus.example.com", "gpus.example.com"),
    ("registry_dir", "--registry-dir", "GPUTOPO_DRA_REGISTRY_DIR", "draRegistryDir", "/r", "/r"),
    ("plugins_dir", "--plugins-dir", "GPUTOPO_DRA_PLUGINS_DIR", "draPluginsDir", "/p", "/p"),
    ("set_sizes", "--set-sizes", "GPUTOPO_DRA_SET_SIZES", "draSetSizes", "8,2", (2, 8)),
    ("max_sets", "--max-sets", "GPUTOPO_DRA_MAX_SETS", "draMaxSets", "100", 100),
    ("sysfs", "--sysfs", "GPUTOPO_SYSFS", "sysfs", "/host/sys", "/host/sys"),
]  # fmt: skip


def test_dra_settings_are_rows_of_the_one_table() -> None:
    by_name = {opt.name: opt for opt in OPTIONS}
    for name, flag, env, key, _, _ in DRA_SETTINGS:
        opt = by_name[name]
        assert (opt.flag, opt.env, opt.key, opt.modes) == (flag, env, key, (DRA,))
    assert {o.name for o in OPTIONS if DRA in o.modes and len(o.modes) == 1} == {s[0] for s in DRA_SETTINGS}
    defaults = PluginConfig()
    assert (defaults.driver_name, defaults.set_sizes, defaults.max_sets) == (
        draslices.DRIVER,
        draslices.DEFAULT_SIZES,
        draslices.MAX_SETS_PER_SIZE,
    )


@pytest.mark.parametrize(("name", "flag", "env", "key", "text", "value"), DRA_SETTINGS)
def test_each_dra_setting_parses_from_flag_environment_and_file(
    tmp_path: Path, name: str, flag: str, env: str, key: str, text: str, value: Any
) -> None:
    base = {"NODE_NAME": "node-a"}
    assert getattr(load_config([flag, text], base, DRA), name) == value
    assert getattr(load_config([], {**base, env: text}, DRA), name) == value
    file = tmp_path / "plugin.yaml"
    file.write_text(yaml.safe_dump({"version": "v1", key: text}))
    assert getattr(load_config(["--config", str(file)], base, DRA), name) == value
    # the other mode accepts and checks it (one flag moves a node between the modes)
    assert getattr(load_config([flag, text], {}), name) == value


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set-sizes", "1,4"], "flag --set-sizes: sizes must be between 2 and 16"),
        (["--set-sizes", "two"], "flag --set-sizes: must be comma-separated integers"),
        (["--max-sets", "0"], "flag --max-sets: must be between 1 and"),
        (["--driver-name", "gputopo"], "flag --driver-name: must be a DNS subdomain with a dot"),
    ],
)
def test_bad_dra_settings_are_config_errors_in_either_mode(args: list[str], message: str) -> None:
    for mode in settings.MODES:
        with pytest.raises(ConfigError, match=message):
            load_config(args, {"NODE_NAME": "node-a"}, mode)


def test_dra_mode_needs_the_node_name_the_device_plugin_does_not() -> None:
    with pytest.raises(ConfigError, match="DRA mode needs the node name"):
        load_config([], {}, DRA)
    assert load_config([], {}).node_name is None


def test_the_set_sizes_file_key_takes_a_list(tmp_path: Path) -> None:
    file = tmp_path / "plugin.yaml"
    file.write_text(yaml.safe_dump({"version": "v1", "draSetSizes": [4, 2, 4]}))
    assert load_config(["--config", str(file), "--node-name", "n"], {}, DRA).set_sizes == (2, 4)
