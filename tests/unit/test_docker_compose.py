"""docker-compose.yml: valid for today's Compose, the worker given every Slack setting the
shell has, and one's own rules and price book mounted where the worker reads them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

ROOT = Path(__file__).parents[2]
COMPOSE = ROOT / "docker-compose.yml"


def worker() -> dict[str, Any]:
    document = YAML(typ="safe").load(COMPOSE.read_text())
    assert "version" not in document, "Compose ignores `version:` and warns about it"
    found: dict[str, Any] = document["services"]["costline-worker"]
    return found


@pytest.mark.parametrize("variable", [
    "SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET", "SLACK_API_URL", "COSTLINE_SLACK_CHANNELS",
    "COSTLINE_SLACK_APPROVERS", "COSTLINE_SLACK_FALLBACK_CHANNEL"])
def test_the_worker_is_given_each_slack_setting_from_the_shell(variable: str) -> None:
    environment = worker()["environment"]
    assert variable in environment and environment[variable] is None  # passed through


def test_the_rules_and_prices_the_worker_reads_are_mounted_and_can_be_ones_own() -> None:
    service = worker()
    mounts = {target: source for source, target, _ in
              (volume.rsplit(":", 2) for volume in service["volumes"])}
    assert service["environment"]["COSTLINE_RULES"] in mounts
    assert service["environment"]["COSTLINE_PRICES"] in mounts
    assert mounts[service["environment"]["COSTLINE_RULES"]] == \
        "${COSTLINE_RULES_DIR:-./rules/definitions}"
    assert (ROOT / "rules" / "definitions").is_dir()
    assert (ROOT / "rules" / "prices" / "example.yaml").is_file()


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose not installed")
def test_compose_accepts_the_file() -> None:
    done = subprocess.run(["docker-compose", "-f", str(COMPOSE), "config", "-q"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "version" not in done.stderr.lower()
