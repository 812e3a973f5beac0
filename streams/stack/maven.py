"""The Apache Kafka jars, fetched once from Maven Central into a cache folder.

The broker is not vendored: the checked-in ``apache-kafka/pom.xml`` names the exact release,
Maven resolves it and its runtime dependencies, and the folder of jars is the classpath. A
marker holding the pom's digest says the folder is complete and matches the pom; a changed
pom (a new Kafka release) empties the folder and fetches again. Several processes may ask at
once (parallel tests): a file lock lets one fetch while the others wait.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

from costline.streams.stack.errors import StackError
from costline.streams.stack.layout import file_lock
from costline.streams.stack.process import log_tail
from costline.streams.stack.services import require_binary

POM = Path(__file__).parent / "apache-kafka" / "pom.xml"
MARKER = ".costline-complete"
FETCH_TIMEOUT_S = 900


def _digest() -> str:
    return hashlib.sha256(POM.read_bytes()).hexdigest()


def _complete(libs: Path) -> bool:
    marker = libs / MARKER
    return marker.is_file() and marker.read_text().strip() == _digest()


def _clear(libs: Path) -> None:
    """Drop jars of an older pom (mixed releases on one classpath break the broker).

    Only jars and the marker go: the folder may be one the user chose and shares.
    """
    for stale in [*libs.glob("*.jar"), libs / MARKER]:
        stale.unlink(missing_ok=True)


def _fetch(libs: Path, log: Path) -> None:
    mvn = require_binary(
        lambda: shutil.which("mvn"),
        "Maven ('mvn')",
        "Apache Kafka's jars are fetched with Maven once; install it "
        "(Debian: apt-get install maven) or use --kafka embedded",
    )
    # Maven writes next to the pom: give it a private copy, the package may be read-only.
    build = libs.parent / f".{libs.name}-build"
    build.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(POM, build / "pom.xml")
    _clear(libs)
    command = [
        mvn, "-q", "-B", "-f", str(build / "pom.xml"), "dependency:copy-dependencies",
        f"-DoutputDirectory={libs}", "-DincludeScope=runtime",
    ]
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        try:
            done = subprocess.run(
                command, stdout=out, stderr=subprocess.STDOUT, timeout=FETCH_TIMEOUT_S
            )
        except subprocess.TimeoutExpired as exc:
            raise StackError(f"fetching Apache Kafka jars took over {FETCH_TIMEOUT_S}s; "
                             f"see {log}") from exc
    if done.returncode != 0 or not any(libs.glob("kafka_2.13-*.jar")):
        raise StackError(f"fetching Apache Kafka jars with Maven failed "
                         f"(exit {done.returncode}); see {log}:\n{log_tail(log)}")
    (libs / MARKER).write_text(_digest() + "\n")


def ensure_kafka_jars(libs: Path, log: Path) -> Path:
    """The folder of Apache Kafka jars, fetched with Maven only when missing or outdated."""
    if _complete(libs):
        return libs
    with file_lock(libs.parent / f".{libs.name}.lock"):
        if not _complete(libs):
            _fetch(libs, log)
    return libs
