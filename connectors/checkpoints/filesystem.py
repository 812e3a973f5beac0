"""Filesystem: checkpoints as files or directories under a local (or mounted) path.

It acts only inside ``root``: a checkpoint whose location, once every symbolic link is
resolved, is not strictly inside ``root`` is refused, as is a location that is itself a link,
so a mistyped or hostile location cannot reach anything else. A move goes to the same place
under ``cold_root`` (the cold tier's mount): renamed when both are on one file system, else
copied, checked and only then removed. Before acting it checks that the checkpoint is the one
planned (same device, inode, size and newest modification time) and that no process has a
file of it open (a restore reading it, a writer not done): either one leaves it alone.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from costline.connectors.checkpoints import (
    CheckpointConnector,
    NotReclaimable,
    checkpoint_connector,
)
from costline.rules.lifecycle import LifecycleAction
from costline.rules.lifecycle_params import CheckpointParams
from costline.rules.reclaim import Outcome, Plan

AbsolutePath = Annotated[str, Field(pattern=r"^/.*", min_length=2, max_length=4096)]
PROC = Path("/proc")
IDENTITY = ("device", "inode", "size", "mtime_ns")


class FilesystemParams(CheckpointParams):
    """Checkpoints under a local or mounted path: moved under cold_root, deleted in place."""

    root: AbsolutePath = Field(description="the folder checkpoints live in: nothing outside "
                               "it is ever moved or deleted")
    cold_root: AbsolutePath | None = Field(None, description="where moved checkpoints go (the "
                                           "cold tier's mount), at the same path under it")


def path_of(location: str) -> Path:
    """A location as a path: ``/lustre/ckpt/step-100`` or ``file:///lustre/ckpt/step-100``."""
    return Path(location.removeprefix("file://"))


def inside(root: str, location: str) -> Path:
    """The checkpoint's resolved path, if it is strictly inside ``root``; else refused."""
    path = path_of(location)
    if not path.is_absolute():
        raise NotReclaimable("failed", f"{location} is not an absolute path")
    if path.is_symlink():
        raise NotReclaimable("failed", f"{location} is a symbolic link: not followed")
    try:
        real, base = path.resolve(strict=True), Path(root).resolve(strict=True)
    except FileNotFoundError as exc:
        raise NotReclaimable("skipped", f"{exc.filename} does not exist") from None
    if real == base or base not in real.parents:
        raise NotReclaimable("failed", f"{real} is not inside root {base}: never touched")
    return real


def _files(path: Path) -> Iterator[Path]:
    if path.is_dir() and not path.is_symlink():
        for parent, _, names in os.walk(path):
            for name in names:
                yield Path(parent) / name
    else:
        yield path


def identity_of(path: Path) -> dict[str, str]:
    """What says it is still the same checkpoint: device, inode, total size, newest change."""
    top = path.lstat()
    size, newest = 0, top.st_mtime_ns
    for file in _files(path):
        info = file.lstat()
        size += info.st_size
        newest = max(newest, info.st_mtime_ns)
    return {"device": str(top.st_dev), "inode": str(top.st_ino), "size": str(size),
            "mtime_ns": str(newest)}


def readers(path: Path, proc: Path = PROC) -> list[str]:
    """Processes holding a file of ``path`` open, as ``pid (command)``."""
    found = []
    prefix = str(path)
    for entry in proc.iterdir() if proc.is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                target = os.readlink(fd)
                if target == prefix or target.startswith(prefix + "/"):
                    command = (entry / "comm").read_text().strip()
                    found.append(f"{entry.name} ({command})")
                    break
        except OSError:
            continue  # gone, or another user's: not readable
    return found


def destination_of(params: FilesystemParams, real: Path) -> Path:
    if params.cold_root is None:
        raise NotReclaimable("failed", "no cold_root: the filesystem connector cannot move")
    base = Path(params.root).resolve(strict=True)
    return Path(params.cold_root) / real.relative_to(base)


@checkpoint_connector("filesystem")
class FilesystemCheckpoints(CheckpointConnector):
    """Moves checkpoints under ``cold_root`` and deletes them, inside ``root`` only.

    ```yaml
    rules:
      - name: scratch-retention
        kind: checkpoint_lifecycle
        match: {project: llm-70b}
        keep_last: 3
        keep_every: 10
        cold_after: 2d
        cold_tier: storage.object
        expire_after: 14d
        act:
          connector: filesystem
          grace: 30m
          root: /lustre/checkpoints
          cold_root: /mnt/object/checkpoints
          max_per_hour: 200
        mode: live
    ```
    """

    params_model = FilesystemParams

    def __init__(self, proc: Path = PROC) -> None:
        self._proc = proc

    async def identify(self, action: LifecycleAction, params: Mapping[str, Any]
                       ) -> dict[str, str]:
        return await asyncio.to_thread(self._identify, action, FilesystemParams(**params))

    def _identify(self, action: LifecycleAction, params: FilesystemParams) -> dict[str, str]:
        real = inside(params.root, action.checkpoint.location)
        found = {"path": str(real), **identity_of(real)}
        if action.action == "move":
            destination = destination_of(params, real)
            if destination.exists():
                raise NotReclaimable("failed", f"{destination} already exists")
            found["destination"] = str(destination)
        return found

    async def act(self, plan: Plan) -> Outcome:
        try:
            return await asyncio.to_thread(self._act, plan)
        except NotReclaimable as exc:
            return Outcome(exc.step, exc.reason)

    def _act(self, plan: Plan) -> Outcome:
        params = FilesystemParams(**plan.params)
        target = plan.target
        real = inside(params.root, target["location"])
        if str(real) != target.get("path"):
            return Outcome("skipped", f"{target['location']} now resolves to {real}, planned "
                           f"as {target.get('path')}")
        now = identity_of(real)
        changed = [key for key in IDENTITY if now[key] != target.get(key)]
        if changed:
            return Outcome("skipped", f"{real} changed since it was planned "
                           f"({', '.join(changed)})")
        busy = readers(real, self._proc)
        if busy:
            return Outcome("skipped", f"{real} is open by process {', '.join(busy)}: being "
                           "read or written")
        if target["action"] == "delete":
            _remove(real)
            return Outcome("executed", f"deleted {real} ({now['size']} bytes)",
                           {"deleted": str(real)})
        destination = Path(target["destination"])
        _move(real, destination)
        return Outcome("executed", f"moved {real} to {destination}",
                       {"location": str(destination)})


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def _move(source: Path, destination: Path) -> None:
    """Rename on one file system; across two, copy beside the destination, check the copy's
    size, rename it into place and only then remove the source."""
    if destination.exists():
        raise NotReclaimable("failed", f"{destination} already exists")
    destination.parent.mkdir(parents=True, exist_ok=True)
    if source.stat().st_dev == destination.parent.stat().st_dev:
        source.rename(destination)
        return
    partial = destination.with_name(f".{destination.name}.costline-partial")
    if source.is_dir():
        shutil.copytree(source, partial, symlinks=True)
    else:
        shutil.copy2(source, partial)
    if identity_of(partial)["size"] != identity_of(source)["size"]:
        _remove(partial)
        raise NotReclaimable("failed", f"the copy of {source} to {destination} is incomplete")
    partial.rename(destination)
    _remove(source)
