"""`python -m scheduler` as a process: flags, one-line errors with exit code 2, clean stop."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "scheduler", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--listen", "nowhere"], "expected HOST:PORT"),
        (["--cluster", "/nonexistent/cluster.yaml"], "cannot read"),
        (["--levels", "not a label!"], "not a valid node-label key"),
        (["--reservation-ttl", "-3"], "must be positive"),
        (["--gang-spill-after", "-1"], "must be a non-negative number of seconds"),
        (["--gang-spill-after", "nan"], "must be a non-negative number of seconds"),
        (["--bogus"], "unrecognized arguments"),
        (["--kubeconfig", "/nonexistent/kubeconfig"], "cannot load Kubernetes configuration"),
    ],
)
def test_bad_flags_exit_2_with_one_line(args: list[str], message: str) -> None:
    res = run(*args)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], res.stderr


def test_bad_cluster_file_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "c.yaml"
    bad.write_text("nodes:\n  - name: a\n    gpus: no-such-preset\n")
    res = run("--cluster", str(bad))
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert "nodes[0]" in res.stderr


def test_serves_a_cluster_file_and_stops_on_sigterm(tmp_path: Path) -> None:
    cluster = tmp_path / "c.yaml"
    cluster.write_text("nodes:\n  - name: a1\n    gpus: dgx-a100\n    allocated: [0]\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "scheduler", "--cluster", str(cluster), "--listen", "127.0.0.1:0"],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = None
        assert proc.stderr is not None
        for line in proc.stderr:
            doc = json.loads(line)
            if doc["event"] == "listening":
                url = doc["url"]
                break
        assert url
        assert urllib.request.urlopen(url + "/healthz", timeout=10).status == 200
        body = json.dumps(
            {
                "Pod": {
                    "metadata": {"name": "p", "namespace": "ml"},
                    "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "8"}}}]},
                },
                "Nodes": None,
                "NodeNames": ["a1"],
            }
        ).encode()
        req = urllib.request.Request(url + "/filter", data=body, headers={"Content-Type": "application/json"})
        out = json.loads(urllib.request.urlopen(req, timeout=10).read())
        assert out["FailedNodes"] == {"a1": "needs 8 GPUs, 7 free"}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_metrics_listen_serves_prometheus_beside_the_loopback_extender(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a free port for the metrics listener
        s.bind(("127.0.0.1", 0))
        mport = s.getsockname()[1]
    cluster = tmp_path / "c.yaml"
    cluster.write_text("nodes:\n  - name: a1\n    gpus: dgx-a100\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "scheduler", "--cluster", str(cluster), "--listen", "127.0.0.1:0",
         "--metrics-listen", f"127.0.0.1:{mport}"],
        cwd=ROOT, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        events = set()
        for line in proc.stderr:
            events.add(json.loads(line)["event"])
            if {"listening", "metrics_listening"} <= events:
                break
        text = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=10).read().decode()
        assert "gputopo_extender_request_seconds" in text and "gputopo_build_info{" in text
        assert "gputopo_node_annotation_age_seconds" not in text, "a snapshot file's ages mean nothing"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_metrics_listen_port_taken_exits_1(tmp_path: Path) -> None:
    import socket

    cluster = tmp_path / "c.yaml"
    cluster.write_text("nodes:\n  - name: a1\n    gpus: dgx-a100\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = run(
            "--cluster", str(cluster), "--listen", "127.0.0.1:0", "--metrics-listen", f"127.0.0.1:{port}"
        )
    assert out.returncode == 1
    assert out.stderr.strip().endswith("Address already in use") or "cannot listen" in out.stderr


def test_version() -> None:
    out = run("--version")
    assert out.returncode == 0 and out.stdout.strip() == "python -m scheduler 0.1.0"


def test_live_mode_exports_annotation_ages_from_the_watched_nodes(tmp_path: Path) -> None:
    import socket
    import time

    from gputopo.network.annotation import encode, make
    from gputopo.node.topofile import load_preset
    from tests import fake_apiserver as fk

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        mport = s.getsockname()[1]
    with fk.running() as (api, server, _):
        text = encode(
            make("n1", load_preset("dgx-a100"), generated_at=time.time() - 120, plugin_version="0.1.0")
        )
        api.put("nodes", fk.node("n1", annotations={"gputopo.io/topology": text}))
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            f"apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: '{server.url}'}}}}]\n"
            "users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
            "current-context: x\n"
        )
        proc = subprocess.Popen(
            [sys.executable, "-m", "scheduler", "--kubeconfig", str(kubeconfig), "--listen", "127.0.0.1:0",
             "--metrics-listen", f"127.0.0.1:{mport}"],
            cwd=ROOT, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 30
            body = ""
            while "gputopo_node_annotation_age_seconds_gcount 1.0" not in body:
                assert time.monotonic() < deadline, body[-2000:]
                time.sleep(0.2)
                try:
                    body = (
                        urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=5).read().decode()
                    )
                except OSError:
                    continue
            assert 'gputopo_node_annotation_age_seconds_bucket{le="60"} 0.0' in body
            assert 'gputopo_node_annotation_age_seconds_bucket{le="300"} 1.0' in body
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=20) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_signal_handlers_are_installed_before_anything_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whoever sees the metrics port or the extender answer may send SIGTERM at once (the live
    test above does): the handler must already be there, or the process dies by the signal
    (exit -15) instead of stopping with 0. The sidecar once installed its handlers after the
    metrics port served, and the test above lost that race on a loaded machine. Here, in
    process and without timing: each listener's start checks for the handler and then plays
    the signal arriving at that moment."""
    import scheduler.__main__ as sidecar

    seen: list[str] = []

    def sigterm_now(what: str) -> None:
        handler = signal.getsignal(signal.SIGTERM)
        assert callable(handler), f"{what} started before the SIGTERM handler was installed"
        seen.append(what)
        handler(signal.SIGTERM, None)

    serve = sidecar.Server.start

    def start(self: object) -> None:
        sigterm_now("the extender")
        serve(self)  # type: ignore[arg-type]

    monkeypatch.setattr(sidecar, "start_http_server", lambda *_, **__: sigterm_now("the metrics port"))
    monkeypatch.setattr(sidecar.Server, "start", start)
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = sidecar.main(
            ["--cluster", str(ROOT / "data/clusters/two-leaves.yaml"), "--listen", "127.0.0.1:0",
             "--metrics-listen", "127.0.0.1:0"]
        )  # fmt: skip
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    assert code == 0
    assert seen == ["the metrics port", "the extender"]
