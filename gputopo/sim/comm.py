"""Kept for importers of the old name: the simulator's job-time model is gputopo.sim.jobmodel
(on the core model gputopo.jobtime and gputopo.profiles, docs/jobtime.md)."""

from __future__ import annotations

from gputopo.sim.jobmodel import JobModel

CommModel = JobModel

__all__ = ["CommModel", "JobModel"]
