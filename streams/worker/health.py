"""What ``/healthz`` reports: ok, or degraded with the dependency that is failing and since when."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class Health:
    problems: dict[str, tuple[str, float]] = field(default_factory=dict)
    # Facts worth seeing next to the status (e.g. how many rules are loaded).
    facts: dict[str, object] = field(default_factory=dict)
    # A setting that puts exactness at risk while everything works: shown, but the status
    # stays ok, so probes on /healthz do not restart a worker for it.
    warnings: dict[str, str] = field(default_factory=dict)

    def failing(self, dependency: str, error: BaseException | str) -> None:
        text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        since = self.problems.get(dependency, (text, time.time()))[1]
        self.problems[dependency] = (text, since)

    def recovered(self, dependency: str) -> None:
        self.problems.pop(dependency, None)

    @property
    def ok(self) -> bool:
        return not self.problems

    def report(self) -> dict[str, object]:
        return {
            "status": "ok" if self.ok else "degraded",
            "problems": {
                name: {"error": text, "since": since}
                for name, (text, since) in self.problems.items()
            },
            **({"warnings": dict(self.warnings)} if self.warnings else {}),
            **self.facts,
        }
