"""MetricsTracker: a host's JSON-lines metrics file (kept for hosts that record metrics lines).

``MetricsTracker(path).record_ddo_metrics(report, component="transformer")`` appends one line
per report: a ddo MetricsReport goes through the library (ddo_metrics_record, the versioned
snapshot tagged with the component); the report of a non-dynamic route (its as_dict()) is
written by the tracker in the same shape.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any, Dict, List, Optional, Union

from .offload import MetricsReport


class MetricsTracker:
    """Appends reports to path as JSON lines; ``records()`` reads them back."""

    def __init__(self, path: Union[str, "os.PathLike[str]"]) -> None:
        self.path = pathlib.Path(path)

    def record_ddo_metrics(self, report: Any, component: Optional[str] = "transformer") -> None:
        if isinstance(report, MetricsReport):
            report.record(self.path, component)
            return
        if not hasattr(report, "as_dict"):
            raise TypeError(f"record_ddo_metrics takes a ddo metrics report (result."
                            f"metrics_snapshot()), not {type(report).__name__}")
        d = dict(report.as_dict())
        if component:
            d["component"] = component
        line = json.dumps(d, sort_keys=True, separators=(",", ":")) + "\n"
        # one write of whole lines, appended; binary, or Windows would write "\r\n"
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_BINARY", 0)
        fd = os.open(self.path, flags, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    def records(self) -> List[Dict[str, Any]]:
        if not self.path.exists():
            return []
        with open(self.path, encoding="utf-8") as f:
            return [json.loads(x) for x in f if x.strip()]
