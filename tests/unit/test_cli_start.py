"""What ``costline`` loads before a command runs: every command module, but not the Kafka or
HTTP client libraries that only a few commands use (importing them takes about 0.2 s of every
command's start)."""

from __future__ import annotations

import subprocess
import sys

CALLED_OUT = ("kafka", "aiohttp", "aiokafka", "faust")

LOADED = f"""
import sys
from costline.streams.cli.root import _register
_register()
print(" ".join(name for name in {CALLED_OUT!r} if name in sys.modules))
"""


def test_commands_are_registered_without_the_client_libraries_of_a_few() -> None:
    # A fresh interpreter: this test process has imported them all for other tests.
    done = subprocess.run([sys.executable, "-c", LOADED], capture_output=True, text=True,
                          check=True)
    assert done.stdout.split() == []
