"""The FinOps Foundation's FOCUS validator (``focus-validator`` on PyPI), in a virtualenv of its
own, for tests that check costline's FOCUS export against the specification.

It does not share costline's environment: it pins numpy < 2, pandas, pytz < 2024 and pandera
0.17, which would move packages costline's worker runs on. The fixture creates the
environment on first use in ``.costline/focus-validator`` (or uses the executable named by
``COSTLINE_FOCUS_VALIDATOR``); when that fails the test is skipped with the reason, and fails
instead under ``REQUIRE_SERVICES=1`` (CI), so a missing validator never passes silently.

Release 1.0.0 is the one for Python 3.11 (2.x needs 3.12). Its pandera 0.17 needs
multimethod < 2. Two quirks of that release are handled here rather than in costline's file:

* it reads its list of currency codes from a path relative to the working directory, so it
  runs in its own ``site-packages``;
* five rules of its "1.0" set still name columns of the 1.0 preview, which FOCUS 1.0 renamed
  (``InvoiceIssuer``, ``Provider``, ``Publisher``, ``ResourceID`` are ``InvoiceIssuerName``,
  ``ProviderName``, ``PublisherName``, ``ResourceId``; ``ChargeType`` is ``ChargeCategory``):
  they are overridden (reported as skipped), and the test of the columns checks the 1.0 names.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import unavailable

REPO = Path(__file__).resolve().parents[2]
HOME = REPO / ".costline" / "focus-validator"
PACKAGES = ("focus-validator==1.0.0", "multimethod<2")
PREVIEW_RULES = ("InvoiceIssuer_Required", "Provider_Required", "Publisher_Required",
                 "ResourceID_Required", "SkuPriceId_Nullable")


@dataclass(frozen=True)
class Verdict:
    """What the validator said about a file: its checks run, failed and skipped."""

    tests: int
    skipped: int
    failures: dict[str, str]


@dataclass(frozen=True)
class FocusValidator:
    executable: Path

    def validate(self, data: Path, workdir: Path) -> Verdict:
        """Validate ``data`` against FOCUS 1.0; the JUnit report is parsed, as the command
        exits 0 whatever it found."""
        overrides = workdir / "overrides.yaml"
        overrides.write_text("overrides:\n" + "".join(f"  - {r}\n" for r in PREVIEW_RULES))
        report = workdir / "focus-validator.xml"
        done = subprocess.run(
            [str(self.executable), "--data-file", str(data.resolve()), "--validate-version",
             "1.0", "--override-file", str(overrides), "--output-type", "unittest",
             "--output-destination", str(report)],
            cwd=self._site_packages(), capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and report.is_file(), done.stderr[-2000:]
        root = ET.parse(report).getroot()
        failures = {}
        for case in root.iter("testcase"):
            for failure in (*case.findall("failure"), *case.findall("error")):
                failures[case.get("name", "?")] = (failure.get("message") or failure.text or "")
        return Verdict(int(root.get("tests", 0)), int(root.get("skipped", 0)), failures)

    def _site_packages(self) -> Path:
        found = subprocess.run(
            [str(self.executable.parent / "python"), "-c",
             "import focus_validator, pathlib; "
             "print(pathlib.Path(focus_validator.__file__).parent.parent)"],
            capture_output=True, text=True, check=True, timeout=60)
        return Path(found.stdout.strip())


def _install(home: Path) -> Path:
    executable = home / "bin" / "focus-validator"
    if executable.is_file():
        return executable
    steps = [[sys.executable, "-m", "venv", str(home)],
             [str(home / "bin" / "python"), "-m", "pip", "install", "--quiet", *PACKAGES]]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            unavailable("focus-validator", f"{' '.join(step[:4])}…: {done.stderr[-500:]}")
    return executable


@pytest.fixture(scope="session")
def focus_validator() -> FocusValidator:
    named = os.environ.get("COSTLINE_FOCUS_VALIDATOR")
    executable = Path(named) if named else _install(HOME)
    if not executable.is_file():
        unavailable("focus-validator", f"{executable} does not exist")
    return FocusValidator(executable)
