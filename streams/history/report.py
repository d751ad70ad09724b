"""`HistoryReport`: what reading an operator's history dropped, assumed or adjusted, and why (results.json).

Nothing is dropped silently: every check in `streams.history.checks` that changes or drops a record adds an
entry with its count, even when the count is zero for a check that ran (so the report says it ran).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Action = Literal["dropped", "assumed", "adjusted", "checked", "skipped"]


@dataclass(frozen=True)
class ReportEntry:
    """One finding.

    Parameters
    ----------
    check : the check's name ("duplicates", "clock_skew", "gaps", "unknown_gpu_type", ...).
    action : "dropped" (records removed), "assumed" (a value filled in), "adjusted" (records changed),
        "checked" (ran, nothing to do) or "skipped" (an arm or step not run).
    kind : the record kind it concerns ("request_arrival", ...) or "replay".
    count : records (or intervals, for gaps) concerned (count).
    why : the reason and what was done, in words.
    detail : figures behind it (e.g. {"offset_s": 3.0}).
    """

    check: str
    action: Action
    kind: str
    count: int
    why: str
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class HistoryReport:
    """Everything reading and checking a history found; `as_dict` is what results.json carries.

    sources : record kind -> where it was read from (file or topic) and how many records.
    entries : the findings, in the order the checks ran.
    """

    sources: dict[str, dict[str, Any]] = field(default_factory=dict)
    entries: list[ReportEntry] = field(default_factory=list)

    def add(self, check: str, action: Action, kind: str, count: int, why: str, **detail: Any) -> None:
        """Record one finding (see `ReportEntry`)."""
        self.entries.append(ReportEntry(check, action, kind, int(count), why, detail))

    def find(self, check: str) -> list[ReportEntry]:
        """The entries of one check."""
        return [e for e in self.entries if e.check == check]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"sources": self.sources, "entries": [asdict(e) for e in self.entries]}

    def lines(self) -> list[str]:
        """One printable line per finding that dropped, assumed, adjusted or skipped something."""
        return [
            f"{e.action:<9}{e.kind:<20}{e.count:>9}  {e.check}: {e.why}" for e in self.entries if e.action != "checked"
        ]
