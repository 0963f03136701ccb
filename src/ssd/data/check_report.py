"""The result of ``ssd check`` (:func:`ssd.data.check.check_dataset`) and of the training gate: :class:`CheckReport`."""

from __future__ import annotations

from dataclasses import dataclass, field

from ssd.data.records import Issue
from ssd.names import printable
from ssd.priors.coverage import coverage_lines
from ssd.text import render_table

__all__ = ["CheckReport"]

_SHOWN_PER_CODE = 20


@dataclass
class CheckReport:
    """Result of :func:`check_dataset`. ``issues`` holds errors and warnings; ``stats`` per-split / per-class counts;
    ``coverage`` the default-box coverage (or None); ``dropped`` what :func:`screen` with ``skip_invalid`` removed."""

    dataset: str
    format: str
    class_names: list[str]
    stats: dict[str, dict] = field(default_factory=dict)
    issues: list[Issue] = field(default_factory=list)
    coverage: dict | None = None
    dropped: dict | None = None

    @property
    def errors(self) -> list[Issue]:
        return [i for i in self.issues if i.severity == "error"]

    @property
    def warnings(self) -> list[Issue]:
        return [i for i in self.issues if i.severity == "warning"]

    @property
    def ok(self) -> bool:
        """True when there is no error (warnings do not fail)."""
        return not self.errors

    def to_dict(self) -> dict:
        """JSON-serializable form (what ``ssd check --json`` prints)."""
        return {"dataset": self.dataset, "format": self.format, "class_names": self.class_names,
                "num_classes": len(self.class_names), "ok": self.ok, "stats": self.stats,
                "errors": [i.to_dict() for i in self.errors], "warnings": [i.to_dict() for i in self.warnings],
                "coverage": self.coverage, "dropped": self.dropped}

    def format_table(self) -> str:
        """Readable plain-text report: counts per split and class, problems grouped by kind, coverage, verdict."""
        names = [printable(n) for n in self.class_names]  # names are data: never written raw to a terminal
        lines = [f"dataset: {printable(self.dataset)} ({self.format}, {len(names)} classes: {', '.join(names)})", ""]
        header = ["split", "images", "objects", "no objects", *names]
        rows = [[s, st["images"], st["objects"], st["images_without_objects"],
                 *(st["objects_per_class"].get(n, 0) for n in self.class_names)] for s, st in self.stats.items()]
        lines += render_table(header, rows) + [""]
        for title, issues in (("errors", self.errors), ("warnings", self.warnings)):
            if not issues:
                continue
            lines.append(f"{title} ({len(issues)}):")
            by_code: dict[str, list[Issue]] = {}
            for issue in issues:
                by_code.setdefault(issue.code, []).append(issue)
            for code, group in by_code.items():
                lines.append(f"  {code} ({len(group)}):")
                lines += [f"    {printable(i.message)}" for i in group[:_SHOWN_PER_CODE]]
                if len(group) > _SHOWN_PER_CODE:
                    lines.append(f"    ... and {len(group) - _SHOWN_PER_CODE} more (see --json)")
            lines.append("")
        if self.coverage:
            lines += [*coverage_lines(self.coverage), ""]
        if self.dropped:
            lines.append(f"skipped as invalid: {self.dropped['objects']} objects, {self.dropped['images']} images")
        lines.append("OK: no errors" if self.ok else f"FAILED: {len(self.errors)} errors (fix them, or train with "
                     "skip_invalid=true to drop the offending objects/images)")
        return "\n".join(lines)
