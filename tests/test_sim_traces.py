"""Trace readers on small slices of the public traces (tests/data/traces), and bad files."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from gputopo.sim.traces import TraceError, read_trace
from gputopo.sim.workload import Job, generate, pods_for, timed_arrivals

DATA = Path(__file__).parent / "data" / "traces"


def test_helios_slice_gangs_sorting_and_cpu_only() -> None:
    t = read_trace(DATA / "helios_jobs_slice.csv")
    assert t.format == "jobs" and t.timed
    assert t.rows == 21
    assert t.skipped_cpu_only == 4  # job ids 5, 6, 10, 11 have num_gpu 0
    assert len(t.jobs) == 17
    submits = [j.submit for j in t.jobs]
    assert submits == sorted(submits)  # rows 4, 19, 37 come after 11 in the file
    by_submit = {j.submit: j for j in t.jobs}
    assert by_submit[10337.0].pods == (8, 8) and by_submit[10337.0].duration == 194.0
    assert by_submit[28105.0].pods == (8,) * 4
    assert by_submit[778296.0].pods == (8,) * 20
    assert by_submit[134998.0].pods == (8, 8, 8)
    assert by_submit[1506293.0].pods == (2,)  # (2 GPUs, 2 nodes) fits one node: one pod
    assert by_submit[380.0].pods == (8,) and not by_submit[380.0].is_gang


def test_philly_slice_single_pod_when_it_fits_one_node() -> None:
    t = read_trace(DATA / "philly_jobs_slice.csv")
    assert t.format == "jobs" and len(t.jobs) == 24 and t.skipped_cpu_only == 0
    first_eight = next(j for j in t.jobs if j.submit == 395146.0)
    assert first_eight.pods == (8,)  # Philly spread 8 GPUs over 4 nodes; we ask for one
    assert first_eight.duration == 14405.0
    assert sum(j.pods == (8, 8) for j in t.jobs) == 5


def test_alibaba_timed_slice() -> None:
    t = read_trace(DATA / "openb_pod_list_default_slice.csv")
    assert t.format == "alibaba-openb" and t.timed and t.rows == 26
    by_submit = {j.submit: j for j in t.jobs}
    big = by_submit[9437497.0]  # openb-pod-0017, scheduled at creation
    assert big.pods == (8,) and big.duration == 10769854 - 9437497
    pending = by_submit[10001278.0]  # openb-pod-0061 never scheduled
    assert pending.pods == (1,) and pending.duration == 10001403 - 10001278
    assert t.fractional_as_whole == sum(
        1 for line in _rows("openb_pod_list_default_slice.csv") if line[3] == "1" and int(line[4]) < 1000
    )
    assert t.skipped_cpu_only == sum(
        1 for line in _rows("openb_pod_list_default_slice.csv") if line[3] == "0"
    )


def test_alibaba_multigpu_slice_is_untimed() -> None:
    t = read_trace(DATA / "openb_pod_list_multigpu50_slice.csv")
    assert t.format == "alibaba-openb-untimed" and not t.timed
    assert all(math.isinf(j.duration) for j in t.jobs)
    assert [j.pods for j in t.jobs][-10:] == [(8,), (8,), (4,), (4,), (4,), (2,), (8,), (8,), (4,), (2,)]
    assert [j.submit for j in t.jobs] == [float(i) for i in range(len(t.jobs))]


def _rows(name: str) -> list[list[str]]:
    return [line.split(",") for line in (DATA / name).read_text().splitlines()[1:]]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a,b,c\n1,2,3\n", "unknown trace format"),
        ("job_id,submit_time,duration,num_gpu,num_nodes\n0,0,10,x,1\n", ":2: column num_gpu is not a number"),
        ("job_id,submit_time,duration,num_gpu,num_nodes\n0,0,10,1.5,1\n", "must be an integer"),
        ("job_id,submit_time,duration,num_gpu,num_nodes\n0,-5,10,1,1\n", "non-negative"),
        ("job_id,submit_time,duration,num_gpu,num_nodes\n0,0,10,0,1\n", "no GPU jobs"),
        (
            "name,num_gpu,gpu_milli,creation_time,deletion_time,scheduled_time\np,1,1000,10,5,10\n",
            "before the pod",
        ),
        ("", "unknown trace format"),
    ],
)
def test_bad_traces_name_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text(text)
    with pytest.raises(TraceError, match=message):
        read_trace(path)


def test_missing_and_binary_files(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read"):
        read_trace(tmp_path / "nope.csv")
    (tmp_path / "b.csv").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(TraceError):
        read_trace(tmp_path / "b.csv")


def test_pods_for() -> None:
    assert pods_for(0) == ()
    assert pods_for(3) == (3,)
    assert pods_for(8) == (8,)
    assert pods_for(20) == (8, 8, 4)


def test_generator_is_reproducible_and_meets_the_load() -> None:
    a = generate(3000, capacity_gpus=512, load=0.5, rng=np.random.default_rng(7), max_gpus=64)
    b = generate(3000, capacity_gpus=512, load=0.5, rng=np.random.default_rng(7), max_gpus=64)
    assert a == b
    assert sum(len(j.pods) for j in a) >= 3000
    assert max(j.gpus for j in a) <= 64
    span = a[-1].submit - a[0].submit
    offered = sum(j.gpus * j.duration for j in a) / (span * 512)
    assert 0.4 < offered < 0.6  # Poisson noise around the target
    sizes = [j.gpus for j in a]
    assert 0.5 < sizes.count(1) / len(sizes) < 0.65  # Helios: 55 % of GPU jobs use one GPU


def test_untimed_lists_get_alibaba_run_times_and_poisson_arrivals() -> None:
    jobs = [Job(id=i, submit=float(i), duration=math.inf, pods=((1, 2, 4, 8)[i % 4],)) for i in range(4000)]
    timed = timed_arrivals(jobs, capacity_gpus=512, load=0.8, rng=np.random.default_rng(1))
    assert [j.pods for j in timed] == [j.pods for j in jobs]  # order and shapes kept
    assert all(math.isfinite(j.duration) and j.duration >= 1 for j in timed)
    ones = sorted(j.duration for j in timed if j.pods == (1,))
    assert 450 < ones[len(ones) // 2] < 900  # published median 655 s
    span = timed[-1].submit - timed[0].submit
    offered = sum(j.gpus * j.duration for j in timed) / (span * 512)
    assert 0.6 < offered < 1.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # more cells than header columns: csv puts the rest under a None key (was an AttributeError)
        ("job_id,submit_time,duration,num_gpu,num_nodes\n0,0,10,2,1,9,9\n", ":2: 7 cells, the header has 5"),
        # a GPU count no cluster holds: gang of 125 billion pods (was a MemoryError)
        ("job_id,submit_time,duration,num_gpu,num_nodes\n0,0,10,1000000000000,1\n", "at most 1,000,000"),
        ("name,num_gpu,gpu_milli\np,1000000000000,1000\n", "at most 1,000,000"),
        # which num_gpu is meant? csv.DictReader would silently keep the last one
        ("job_id,submit_time,duration,num_gpu,num_nodes,num_gpu\n0,0,10,2,1,3\n", "num_gpu appears twice"),
    ],
)
def test_malformed_rows_and_sizes_are_trace_errors(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text(text)
    with pytest.raises(TraceError, match=message):
        read_trace(path)


def test_a_byte_order_mark_and_crlf_lines_read_like_plain_utf8(tmp_path: Path) -> None:
    """Spreadsheets save CSV with a BOM and CRLF; the BOM used to hide the first column's name."""
    plain = tmp_path / "plain.csv"
    plain.write_text("name,num_gpu,gpu_milli\np0,2,1000\np1,1,500\n")
    excel = tmp_path / "excel.csv"
    excel.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes().replace(b"\n", b"\r\n"))
    a, b = read_trace(plain), read_trace(excel)
    assert b.format == "alibaba-openb-untimed"
    assert b.jobs == a.jobs and b.fractional_as_whole == a.fractional_as_whole == 1
