"""Readers for the public GPU traces in ../shared/traces (the one place the simulator reads files).

Formats are told apart by their CSV header, so a user never has to name one:

* Alibaba openb pod lists (`name,...,num_gpu,gpu_milli[,...,creation_time,deletion_time,scheduled_time]`):
  one row = one pod = one job. CPU-only pods are skipped; a fractional GPU (gpu_milli < 1000)
  counts as one whole GPU, since the device plugin hands out whole GPUs, unless the run shares
  GPUs (`--gpu-sharing`, gputopo/sim/sharing.py): the share is kept in `Job.milli` for that. With times, a pod is
  submitted at `creation_time` and runs `deletion_time - scheduled_time` (a pod never scheduled:
  `deletion_time - creation_time`). The multigpu lists have no times: the trace is *untimed*
  and the simulator replays it as an arrival sequence (FGD-style fill, see docs/simulator.md).
* Helios and Philly job excerpts (`job_id,submit_time,duration,num_gpu,num_nodes,...`): one
  row = one job submitted at `submit_time` running `duration` seconds (at least 1); GPU-less
  jobs are skipped; num_gpu > 8 becomes a gang of 8-GPU pods (workload.pods_for).
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gputopo.sim.workload import Job, pods_for
from gputopo.userfile import MAX_TRACE_BYTES, UserFileError, open_regular

_ALIBABA = ("name", "num_gpu", "gpu_milli")
_ALIBABA_TIMES = ("creation_time", "deletion_time", "scheduled_time")
_JOBS = ("submit_time", "duration", "num_gpu", "num_nodes")
#: Largest job a trace row may ask for. No cluster this simulates comes close; the cap keeps a
#: stray digit from becoming a gang of billions of pods (and a MemoryError).
MAX_JOB_GPUS = 1_000_000


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file and line."""


@dataclass(frozen=True)
class Trace:
    """Jobs of a trace in submission order, and what reading them skipped or approximated."""

    format: str  # "alibaba-openb", "alibaba-openb-untimed" or "jobs"
    jobs: tuple[Job, ...]
    timed: bool
    rows: int
    skipped_cpu_only: int = 0
    fractional_as_whole: int = 0
    notes: Mapping[str, int] = field(default_factory=dict)


def read_trace(path: str | Path) -> Trace:
    """Read any supported trace; TraceError for a missing file, unknown header or bad row."""
    p = Path(path)
    try:
        # utf-8-sig: spreadsheets start CSV files with a byte order mark that would otherwise
        # become part of the first column's name.
        # open_regular: a FIFO or a device (/dev/zero) is refused, never read; size capped
        with os.fdopen(open_regular(str(p), MAX_TRACE_BYTES), newline="", encoding="utf-8-sig") as fh:
            reader = csv.DictReader(fh)
            header = [h.strip() for h in (reader.fieldnames or [])]
            twice = sorted({h for h in header if h and header.count(h) > 1})
            if twice:
                raise TraceError(f"{p}: column {twice[0]} appears twice in the header")
            if all(c in header for c in _ALIBABA):
                return _read_alibaba(p, reader, timed=all(c in header for c in _ALIBABA_TIMES))
            if all(c in header for c in _JOBS):
                return _read_jobs(p, reader)
    except UserFileError as e:
        raise TraceError(f"cannot read trace {e}") from None
    except OSError as e:
        raise TraceError(f"cannot read trace {p}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise TraceError(f"{p}: not a UTF-8 CSV file") from None
    except csv.Error as e:
        raise TraceError(f"{p}: malformed CSV: {e}") from None
    raise TraceError(
        f"{p}: unknown trace format (header {','.join(header) or 'missing'}); expected an Alibaba openb "
        "pod list or a job list with submit_time,duration,num_gpu,num_nodes"
    )


def _rows(p: Path, reader: csv.DictReader[str]) -> Iterator[tuple[int, dict[str, str]]]:
    for row in reader:
        if None in row:  # csv.DictReader files the cells past the header under None
            cells = len(reader.fieldnames or ()) + len(row[None])
            raise TraceError(
                f"{p}:{reader.line_num}: {cells} cells, the header has {len(reader.fieldnames or ())}"
            )
        yield reader.line_num, {(k or "").strip(): (v or "").strip() for k, v in row.items()}


def _num(p: Path, line: int, row: Mapping[str, str], key: str, *, allow_empty: bool = False) -> float | None:
    text = row.get(key, "")
    if text == "":
        if allow_empty:
            return None
        raise TraceError(f"{p}:{line}: column {key} is empty")
    try:
        value = float(text)
    except ValueError:
        raise TraceError(f"{p}:{line}: column {key} is not a number: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise TraceError(f"{p}:{line}: column {key} must be a non-negative number, got {text!r}")
    return value


def _int(p: Path, line: int, row: Mapping[str, str], key: str) -> int:
    value = _num(p, line, row, key)
    assert value is not None
    if value != int(value):
        raise TraceError(f"{p}:{line}: column {key} must be an integer, got {row[key]!r}")
    return int(value)


def _gpus(p: Path, line: int, row: Mapping[str, str]) -> int:
    num_gpu = _int(p, line, row, "num_gpu")
    if num_gpu > MAX_JOB_GPUS:
        raise TraceError(
            f"{p}:{line}: column num_gpu must be at most {MAX_JOB_GPUS:,}, got {row['num_gpu']!r}"
        )
    return num_gpu


def _read_alibaba(p: Path, reader: csv.DictReader[str], *, timed: bool) -> Trace:
    jobs: list[Job] = []
    rows = cpu_only = fractional = 0
    for line, row in _rows(p, reader):
        rows += 1
        num_gpu = _gpus(p, line, row)
        milli = _int(p, line, row, "gpu_milli")
        if num_gpu == 0:
            cpu_only += 1
            continue
        _check_milli(p, line, num_gpu, milli, row["gpu_milli"])
        share = milli if num_gpu == 1 else 1000
        if share < 1000:
            fractional += 1
        if timed:
            created = _num(p, line, row, "creation_time")
            deleted = _num(p, line, row, "deletion_time")
            scheduled = _num(p, line, row, "scheduled_time", allow_empty=True)
            assert created is not None and deleted is not None
            start = created if scheduled is None else scheduled
            if deleted < start:
                raise TraceError(f"{p}:{line}: deletion_time is before the pod started")
            jobs.append(
                Job(
                    id=len(jobs),
                    submit=created,
                    duration=max(1.0, deleted - start),
                    pods=(num_gpu,),
                    milli=share,
                )
            )
        else:
            jobs.append(
                Job(id=len(jobs), submit=float(len(jobs)), duration=math.inf, pods=(num_gpu,), milli=share)
            )
    return _finish(
        "alibaba-openb" if timed else "alibaba-openb-untimed", jobs, timed, rows, cpu_only, fractional
    )


def _check_milli(p: Path, line: int, num_gpu: int, milli: int, text: str) -> None:
    """A GPU pod's `gpu_milli` is its share of each GPU: 1..1000, and 1000 for several GPUs (a
    share of a GPU is a single GPU's; openb never has a fractional multi-GPU pod)."""
    if not 1 <= milli <= 1000:
        raise TraceError(f"{p}:{line}: column gpu_milli of a GPU pod must be 1..1000, got {text!r}")
    if num_gpu > 1 and milli != 1000:
        raise TraceError(f"{p}:{line}: column gpu_milli must be 1000 when num_gpu > 1, got {text!r}")


def _read_jobs(p: Path, reader: csv.DictReader[str]) -> Trace:
    jobs: list[Job] = []
    rows = cpu_only = 0
    for line, row in _rows(p, reader):
        rows += 1
        submit = _num(p, line, row, "submit_time")
        duration = _num(p, line, row, "duration")
        num_gpu = _gpus(p, line, row)
        _int(p, line, row, "num_nodes")
        assert submit is not None and duration is not None
        shape = pods_for(num_gpu)
        if not shape:
            cpu_only += 1
            continue
        jobs.append(Job(id=len(jobs), submit=submit, duration=max(1.0, duration), pods=shape))
    return _finish("jobs", jobs, True, rows, cpu_only, 0)


def _finish(fmt: str, jobs: list[Job], timed: bool, rows: int, cpu_only: int, fractional: int) -> Trace:
    if not jobs:
        raise TraceError(f"trace has no GPU jobs ({rows} rows, {cpu_only} CPU-only)")
    ordered = sorted(jobs, key=lambda j: (j.submit, j.id))
    return Trace(
        format=fmt,
        jobs=tuple(ordered),
        timed=timed,
        rows=rows,
        skipped_cpu_only=cpu_only,
        fractional_as_whole=fractional,
    )
