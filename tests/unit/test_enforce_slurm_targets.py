"""Which Slurm account or user an enforcement names: one, or none at all. Tag values may hold
any character, and Slurm's commands read a comma as a list of names and a leading dash as an
option; an account with associations on several clusters would be set, and restored, as one."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from costline.connectors.enforce import NotEnforceable
from costline.connectors.enforce.slurm import SlurmEnforcer
from costline.connectors.reclaim.slurm import Completed
from costline.rules.enforce import EnforcePlan


class Commands:
    """Answers ``sacctmgr show assoc`` with ``lines``; records every command."""

    def __init__(self, lines: Sequence[str] = ()) -> None:
        self.lines, self.calls = list(lines), []  # type: list[str], list[list[str]]

    async def __call__(self, argv: Sequence[str]) -> Completed:
        self.calls.append(list(argv))
        return Completed(0, "\n".join(self.lines) + "\n", "")


def plan(team: str, **params: Any) -> EnforcePlan:
    return EnforcePlan(plan_id="p", rule="team-daily", group={"team": team}, connector="slurm",
                       params={"account_tag": "team", **params},
                       mode="live", grace=600, target={}, line="limit", threshold=1, spent=2,
                       limit=1, currency="USD", planned_at=0.0, execute_at=600.0,
                       period_start=0.0, period_end=86400.0)


@pytest.mark.parametrize("team", ["research,pretrain", "-A", "a b", "a=b", "x'y"])
def test_a_tag_value_that_is_not_one_slurm_name_is_refused_before_any_command(
        team: str) -> None:
    commands = Commands()
    with pytest.raises(NotEnforceable, match="is not one Slurm account name"):
        asyncio.run(SlurmEnforcer(run=commands).identify(
            plan(team, action="limit", grp_tres={"cpu": 0})))
    assert commands.calls == []


def test_an_account_on_several_clusters_needs_the_cluster_named() -> None:
    commands = Commands(["hpc-a|research||cpu=16||||", "hpc-b|research||cpu=512||||"])
    with pytest.raises(NotEnforceable, match=r"2 associations \(cluster hpc-a account "
                                             r"research, cluster hpc-b account research\)"):
        asyncio.run(SlurmEnforcer(run=commands).identify(
            plan("research", action="limit", grp_tres={"cpu": 0})))
    assert all(call[:2] != ["sacctmgr", "--immediate"] for call in commands.calls)


def test_one_association_is_found() -> None:
    commands = Commands(["hpc-a|research||cpu=16||||"])
    target = asyncio.run(SlurmEnforcer(run=commands).identify(
        plan("research", action="limit", grp_tres={"cpu": 0}, cluster="hpc-a")))
    assert target == {"account": "research"}
    assert "cluster=hpc-a" in commands.calls[0]
