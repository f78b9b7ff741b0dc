"""Left for report.py only: the first words of the uninitialised-memory cause (UNINITIALISED), which
report.py imports from here. Every cause lives in causes/ (causes/start.py holds this one); once
report.py imports UNINITIALISED from mgpu.check.script.causes.start, delete this module."""

from __future__ import annotations

from mgpu.check.script.causes.start import UNINITIALISED

__all__ = ["UNINITIALISED"]
