"""The demo runs the shipped rules with its own reclamation settings: they must still load."""

from __future__ import annotations

import pytest

from costline.connectors.plugins import PLUGINS
from costline.rules.loader import load_rules
from costline.streams.demo.run import Demo
from costline.streams.settings import Settings


@pytest.mark.parametrize("live", [True, False])
def test_the_demo_rules_load_with_or_without_slurm(tmp_path, live):
    demo = Demo(Settings(state_dir=tmp_path), days=1, use_running=False, keep=False, quiet=True)
    rules = load_rules([demo._rules(live)], "UTC", plugins=PLUGINS)
    idle = [rule for rule in rules if rule.kind == "idle" and rule.reclaim is not None]
    assert idle, "the shipped rules reclaim idle GPUs"
    for rule in idle:
        assert rule.mode == ("live" if live else "dry_run")
        assert rule.reclaim.connector == ("slurm" if live else "dry_run")
