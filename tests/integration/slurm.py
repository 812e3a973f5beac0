"""Fixtures of the reclamation integration tests: a real single-node Slurm, and a Redis.

``slurm`` uses the cluster when ``sinfo`` shows a node that takes jobs; otherwise it runs
``.ci/slurm.sh`` (install, configure, start) and stops at the end what it started. Either
service missing skips the test with the reason, or fails it when ``REQUIRE_SERVICES=1``.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import unavailable
from tests.integration.streamkit import configured_or_private_redis

REPO = Path(__file__).parents[2]
SCRIPT = REPO / ".ci" / "slurm.sh"
READY_STATES = ("idle", "mix", "alloc")


def _node_state() -> str:
    if shutil.which("sinfo") is None:
        return "sinfo not installed"
    done = subprocess.run(["sinfo", "--noheader", "--Node", "--format", "%t"],
                          capture_output=True, text=True, timeout=15, check=False)
    return done.stdout.split()[0] if done.returncode == 0 and done.stdout.split() else (
        done.stderr.strip() or "no node")


def _squeue(job_id: str) -> str:
    done = subprocess.run(["squeue", "--noheader", "--states=all", "--jobs", job_id,
                           "--format", "%T"], capture_output=True, text=True, timeout=15,
                          check=False)
    return done.stdout.strip() or "gone"


@dataclass
class SlurmCluster:
    """Submits ``sleep`` jobs and cancels whatever a test left running."""

    submitted: list[str] = field(default_factory=list)

    def submit(self, name: str, seconds: int = 600, *options: str) -> str:
        """``options``: more of sbatch's, e.g. ``--account=...``, ``--begin=now+5``."""
        done = subprocess.run(
            ["sbatch", "--parsable", f"--job-name={name}", "--output=/dev/null",
             "--chdir=/tmp", *options, "--wrap", f"sleep {seconds}"],
            capture_output=True, text=True, timeout=30, check=True)
        job_id = done.stdout.strip().split(";")[0]
        self.submitted.append(job_id)
        return job_id

    def state(self, job_id: str) -> str:
        return _squeue(job_id)

    def reason(self, job_id: str) -> str:
        """``PENDING AssocGrpCpuLimit``: the job's state and Slurm's reason for it."""
        done = subprocess.run(["squeue", "--noheader", "--jobs", job_id, "--format", "%T %r"],
                              capture_output=True, text=True, timeout=15, check=False)
        return done.stdout.strip() or "gone"

    def wait_running(self, *job_ids: str, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            states = {job_id: self.state(job_id) for job_id in job_ids}
            if all(state == "RUNNING" for state in states.values()):
                return
            time.sleep(0.25)
        raise AssertionError(f"jobs did not start within {timeout_s}s: {states}")

    def cancel_all(self) -> None:
        if self.submitted:
            subprocess.run(["scancel", *self.submitted], capture_output=True, timeout=30,
                           check=False)
            self.submitted.clear()


@pytest.fixture(scope="session")
def slurm_up() -> Iterator[None]:
    """A Slurm cluster that takes jobs, started by ``.ci/slurm.sh`` if need be."""
    started = False
    if _node_state() not in READY_STATES:
        if os.geteuid() != 0 and shutil.which("sudo") is None:
            unavailable("Slurm", f"not running ({_node_state()}) and cannot start it as "
                        "non-root")
        done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True,
                              timeout=600, check=False)
        if done.returncode != 0 or _node_state() not in READY_STATES:
            unavailable("Slurm", f".ci/slurm.sh failed: {(done.stdout + done.stderr)[-800:]}")
        started = True
    yield
    if started:
        subprocess.run(["bash", str(SCRIPT), "stop"], capture_output=True, timeout=120,
                       check=False)


@pytest.fixture
def slurm(slurm_up: None) -> Iterator[SlurmCluster]:
    cluster = SlurmCluster()
    yield cluster
    cluster.cancel_all()


@pytest.fixture(scope="session")
def reclaim_redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``COSTLINE_REDIS_URL`` when set, else a private redis-server on a spare port."""
    with configured_or_private_redis(tmp_path_factory.mktemp("redis")) as url:
        yield url


def accounting_enforced() -> bool:
    done = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True,
                          timeout=15, check=False)
    return any(line.startswith("AccountingStorageEnforce") and "associations" in line
               for line in done.stdout.splitlines())


def sacctmgr(*args: str) -> str:
    done = subprocess.run(["sacctmgr", "--immediate", "--noheader", "--parsable2", *args],
                          capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0 and "nothing" not in (done.stdout + done.stderr).lower():
        raise AssertionError(f"sacctmgr {' '.join(args)}: {done.stderr or done.stdout}")
    return done.stdout


@pytest.fixture(scope="session")
def slurm_accounting(slurm_up: None) -> None:
    """Slurm with slurmdbd and ``AccountingStorageEnforce=associations,limits,qos``: what
    ``.ci/slurm.sh`` starts; a cluster configured elsewhere without it is unavailable."""
    if not accounting_enforced():
        done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True,
                              timeout=600, check=False)
        if not accounting_enforced():
            unavailable("Slurm accounting", "AccountingStorageEnforce lacks associations: "
                        f"{(done.stdout + done.stderr)[-400:]}")


@pytest.fixture
def slurm_account(slurm_accounting: None, slurm: SlurmCluster) -> Iterator[str]:
    """A fresh Slurm account with root's association in it; removed afterwards."""
    account = "cl" + secrets.token_hex(4)
    sacctmgr("add", "account", account, "description=costline test",
             "organization=costline")
    sacctmgr("add", "user", "root", f"account={account}")
    yield account
    slurm.cancel_all()
    subprocess.run(["scancel", f"--account={account}"], capture_output=True, timeout=30,
                   check=False)
    time.sleep(0.5)
    sacctmgr("delete", "user", "root", f"account={account}")
    sacctmgr("delete", "account", account)
