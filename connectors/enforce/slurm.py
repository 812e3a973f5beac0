"""Slurm: hold a group's pending jobs, limit its association, or move it to a restricted QOS.

The group's Slurm account is the value of its ``account_tag`` tag (its user, of ``user_tag``).
Three actions, each undone exactly by the lift:

* ``hold_pending`` — ``scontrol hold`` every pending job of the account that is not held
  already; on every tick afterwards, the jobs submitted since (the sweep). The lift releases
  the jobs costline held that are still pending and held by an administrator, and no other.
  Running jobs are never touched.
* ``limit`` — ``sacctmgr modify`` the account's (or user's) association: ``GrpTRESMins``,
  ``GrpTRES``, ``MaxSubmitJobs``. Slurm then keeps new jobs pending (``AssocGrp*Limit``) or
  refuses them at submission (``MaxSubmitJobs: 0``); running jobs go on. The values before
  are recorded per limit and restored; a limit someone changed since is left as it is.
* ``qos`` — set the association's ``QOS`` and ``DefaultQOS`` to a restricted QOS (one with
  ``GrpTRES=cpu=0``, say), restored the same way.

``limit`` and ``qos`` need accounting (slurmdbd) with ``AccountingStorageEnforce`` including
``associations,limits`` (``qos`` for ``qos``). Note that Slurm kills an association's running
jobs once its usage reaches ``GrpTRESMins``; ``GrpTRES`` and ``MaxSubmitJobs`` only stop new
work.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from costline.connectors.enforce import EnforceConnector, NotEnforceable, enforcer
from costline.connectors.reclaim.slurm import Run, run_command
from costline.rules.enforce import EnforcePlan
from costline.rules.enforce_params import EnforceParams
from costline.rules.kinds import DimensionKey
from costline.rules.reclaim import Outcome

Action = Literal["hold_pending", "limit", "qos"]
HELD_BY_ADMIN = "JobHeldAdmin"
JOB = "job:"
ASSOC = "assoc"
Tres = dict[str, int]
# One Slurm account or user name. Slurm's commands read a comma as a list of names, and an
# argument starting with a dash as an option: a tag value holding either would act on others.
SLURM_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@+-]{0,127}$")


class SlurmEnforceParams(EnforceParams):
    """Slurm: hold the group's pending jobs, limit its association, or restrict its QOS."""

    action: Action = Field(
        "hold_pending",
        description="hold_pending (scontrol hold its pending jobs, and new ones each tick), "
        "limit (sacctmgr: grp_tres_mins, grp_tres, max_submit_jobs) or qos (sacctmgr: QOS "
        "and DefaultQOS set to qos)",
    )
    account_tag: DimensionKey | None = Field(
        None, description="group tag whose value is the Slurm account"
    )
    user_tag: DimensionKey | None = Field(
        None, description="group tag whose value is the Slurm user (with account_tag: that "
        "user's association in the account)"
    )
    cluster: str | None = Field(
        None, pattern=r"^[A-Za-z0-9_.-]{1,64}$",
        description="the Slurm cluster of the association (default: every cluster)"
    )
    grp_tres_mins: Tres | None = Field(
        None, description="limit: GrpTRESMins to set, TRES → minutes (e.g. {cpu: 0})"
    )
    grp_tres: Tres | None = Field(
        None, description="limit: GrpTRES to set, TRES → count (e.g. {cpu: 0, gres/gpu: 0})"
    )
    max_submit_jobs: int | None = Field(
        None, ge=0, description="limit: MaxSubmitJobs to set (0 refuses new submissions)"
    )
    qos: str | None = Field(
        None, pattern=r"^[A-Za-z0-9_.-]{1,64}$",
        description="qos: the restricted QOS the association is moved to (it must exist)"
    )

    @model_validator(mode="after")
    def _complete(self) -> SlurmEnforceParams:
        if self.account_tag is None and self.user_tag is None:
            raise PydanticCustomError("enforce", "slurm needs account_tag, user_tag or both")
        if self.action == "limit" and not self.settings():
            raise PydanticCustomError(
                "enforce", "action limit needs grp_tres_mins, grp_tres or max_submit_jobs")
        if self.action == "qos" and self.qos is None:
            raise PydanticCustomError("enforce", "action qos needs qos")
        return self

    def settings(self) -> dict[str, str]:
        """The association fields the action sets, as sacctmgr writes them."""
        if self.action == "qos":
            return {"QOS": self.qos or "", "DefaultQOS": self.qos or ""}
        found = {}
        if self.grp_tres_mins is not None:
            found["GrpTRESMins"] = tres_text(self.grp_tres_mins)
        if self.grp_tres is not None:
            found["GrpTRES"] = tres_text(self.grp_tres)
        if self.max_submit_jobs is not None:
            found["MaxSubmitJobs"] = str(self.max_submit_jobs)
        return found


FORMAT_FIELDS = {"GrpTRESMins": "GrpTRESMins", "GrpTRES": "GrpTRES",
                 "MaxSubmitJobs": "MaxSubmit", "QOS": "QOS", "DefaultQOS": "DefaultQOS"}
"""Association fields: as ``set`` names them → as ``show assoc format=`` names them."""


def tres_text(tres: Mapping[str, int]) -> str:
    return ",".join(f"{name}={count}" for name, count in sorted(tres.items()))


def tres_of(text: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in text.split(",") if "=" in item)


def restore_value(field: str, before: str, applied: str) -> str:
    """What ``set`` takes to put ``field`` back to ``before``: for TRES, each TRES that
    costline set goes back to its old count, or ``-1`` (no limit) when it had none."""
    if field in ("GrpTRESMins", "GrpTRES"):
        old = tres_of(before)
        return ",".join(f"{name}={old.get(name, '-1')}" for name in sorted(tres_of(applied)))
    if field in ("MaxSubmitJobs", "DefaultQOS"):
        return before or "-1"
    return before or "''"


def still_applied(field: str, current: str, applied: str) -> bool:
    """Whether the association still holds what costline set (no one changed it since)."""
    if field in ("GrpTRESMins", "GrpTRES"):
        now = tres_of(current)
        return all(now.get(name) == value for name, value in tres_of(applied).items())
    if field == "QOS":
        return sorted(current.split(",")) == sorted(applied.split(","))
    return current == applied


@enforcer("slurm")
class SlurmEnforcer(EnforceConnector):
    """Talks to Slurm through its client commands (``squeue``, ``scontrol``, ``sacctmgr``).

    ```yaml
    rules:
      - name: team-daily-gpu
        kind: budget
        match: {cluster: hpc-a}
        group_by: [team]
        period: day
        limit: 5000
        warn_at: [0.9]
        enforce:
          connector: slurm
          action: limit
          account_tag: team
          grp_tres: {gres/gpu: 0}
          at: limit
          grace: 10m
          approval: manual
    ```
    """

    params_model = SlurmEnforceParams

    def __init__(self, run: Run | None = None) -> None:
        self._run: Run = run or run_command

    def sweeps(self, plan: EnforcePlan) -> bool:
        return _params(plan).action == "hold_pending"

    async def identify(self, plan: EnforcePlan) -> dict[str, str]:
        params = _params(plan)
        target: dict[str, str] = {}
        for key, tag in (("account", params.account_tag), ("user", params.user_tag)):
            if tag is None:
                continue
            value = plan.group.get(tag, "")
            if not value:
                raise NotEnforceable("failed", f"the group has no {tag} tag to name the "
                                     f"Slurm {key}")
            if not SLURM_NAME.match(value):
                raise NotEnforceable("failed", f"{tag} {value!r} is not one Slurm {key} name "
                                     "(letters, digits, _ . @ + -): nothing done")
            target[key] = value
        if params.action != "hold_pending":
            await self._association(target, params)
        return target

    def describe(self, plan: EnforcePlan) -> str:
        params = _params(plan)
        who = _who(plan.target)
        if params.action == "hold_pending":
            return f"hold the pending jobs of {who}"
        settings = " ".join(f"{k}={v}" for k, v in params.settings().items())
        return f"set {settings} on {who}"

    async def snapshot(self, plan: EnforcePlan, before: Mapping[str, Any]) -> dict[str, Any]:
        params = _params(plan)
        if params.action == "hold_pending":
            jobs = await self._pending(plan.target)
            return {f"{JOB}{job_id}": {"reason": reason} for job_id, reason in jobs.items()
                    if not reason.startswith("JobHeld") and f"{JOB}{job_id}" not in before}
        if ASSOC in before:
            return {}
        current = await self._association(plan.target, params)
        return {ASSOC: {field: current[field] for field in params.settings()}}

    async def apply(self, plan: EnforcePlan, before: Mapping[str, Any]) -> Outcome:
        params = _params(plan)
        if params.action == "hold_pending":
            return await self._hold(plan, sorted(_job_ids(before)))
        settings = params.settings()
        await self._modify(plan.target, params, settings)
        current = await self._association(plan.target, params)
        off = [f for f, value in settings.items() if not still_applied(f, current[f], value)]
        if off:
            return Outcome("failed", f"sacctmgr left {', '.join(off)} of {_who(plan.target)} "
                           f"at {', '.join(current[f] or '(none)' for f in off)}")
        return Outcome("executed", f"set {_settings_text(settings)} on {_who(plan.target)} "
                       f"(was {_settings_text(before.get(ASSOC, {}))})",
                       {"slurm": settings})

    async def lift(self, plan: EnforcePlan, before: Mapping[str, Any]) -> Outcome:
        params = _params(plan)
        if params.action == "hold_pending":
            return await self._release(plan, sorted(_job_ids(before)))
        recorded: Mapping[str, str] = before.get(ASSOC, {})
        if not recorded:
            return Outcome("executed", f"nothing was changed on {_who(plan.target)}")
        settings = params.settings()
        current = await self._association(plan.target, params)
        mine = {f: restore_value(f, recorded[f], settings[f]) for f in recorded
                if still_applied(f, current[f], settings[f])}
        theirs = sorted(set(recorded) - set(mine))
        if mine:
            await self._modify(plan.target, params, mine)
        if params.action == "qos" and "DefaultQOS" in mine:
            await self._requalify(plan.target, params.qos or "", recorded)
        who = _who(plan.target)
        reason = (f"restored {_settings_text({f: recorded[f] for f in mine})} on {who}"
                  if mine else f"nothing to restore on {who}")
        if theirs:
            reason += (f"; left {', '.join(theirs)} as someone changed it since "
                       f"({_settings_text({f: current[f] for f in theirs})})")
        return Outcome("executed", reason, {"restored": sorted(mine), "left": theirs})

    # ── jobs ──────────────────────────────────────────────────────────────────────────────

    async def _pending(self, target: Mapping[str, str]) -> dict[str, str]:
        """Pending jobs of the target: job id → reason."""
        argv = ["squeue", "--noheader", "--states=PENDING", "--format", "%i|%r"]
        if "account" in target:
            argv += ["--account", target["account"]]
        if "user" in target:
            argv += ["--user", target["user"]]
        done = await self._run(argv)
        if done.returncode != 0:
            raise RuntimeError(f"squeue failed: {done.stderr.strip()[:200]}")
        rows = (line.split("|", 1) for line in done.stdout.splitlines() if "|" in line)
        return {job_id.strip(): reason.strip() for job_id, reason in rows}

    async def _hold(self, plan: EnforcePlan, job_ids: Sequence[str]) -> Outcome:
        if not job_ids:
            return Outcome("executed", f"no pending jobs of {_who(plan.target)} to hold; new "
                           "ones are held as they come", {"held": []})
        pending = await self._pending(plan.target)
        holdable = [job_id for job_id in job_ids if job_id in pending
                    and not pending[job_id].startswith("JobHeld")]
        if holdable:
            done = await self._run(["scontrol", "hold", ",".join(holdable)])
            if done.returncode != 0:
                pending = await self._pending(plan.target)
                left = [j for j in holdable if j in pending
                        and not pending[j].startswith("JobHeld")]
                if left:
                    return Outcome("failed", f"scontrol hold left jobs {', '.join(left)} "
                                   f"pending: {done.stderr.strip()[:200]}")
        return Outcome("executed", f"held {len(holdable)} pending job(s) of "
                       f"{_who(plan.target)}: {', '.join(holdable) or 'none left'}",
                       {"held": holdable})

    async def _release(self, plan: EnforcePlan, job_ids: Sequence[str]) -> Outcome:
        pending = await self._pending(plan.target)
        mine = [job_id for job_id in job_ids if pending.get(job_id) == HELD_BY_ADMIN]
        if mine:
            done = await self._run(["scontrol", "release", ",".join(mine)])
            if done.returncode != 0:
                return Outcome("failed", f"scontrol release {','.join(mine)} failed: "
                               f"{done.stderr.strip()[:200]}")
        gone = len(job_ids) - len(mine)
        rest = f"; {gone} had ended or were released already" if gone else ""
        return Outcome("executed", f"released {len(mine)} job(s) of {_who(plan.target)} "
                       f"costline held{rest}", {"released": mine})

    async def _requalify(self, target: Mapping[str, str], restricted: str,
                         recorded: Mapping[str, str]) -> None:
        """Jobs submitted while restricted took its QOS as their default: give the pending
        ones the default back, or they would stay pending with ``InvalidQOS``."""
        default = recorded.get("DefaultQOS") or recorded.get("QOS", "").split(",")[0]
        if not default:
            return
        argv = ["squeue", "--noheader", "--states=PENDING", "--format", "%i|%q"]
        argv += ["--account", target["account"]] if "account" in target else []
        argv += ["--user", target["user"]] if "user" in target else []
        done = await self._run(argv)
        rows = (line.split("|", 1) for line in done.stdout.splitlines() if "|" in line)
        for job_id, qos in rows:
            if qos.strip() == restricted:
                await self._run(["scontrol", "update", f"JobId={job_id.strip()}",
                                 f"QOS={default}"])

    # ── associations ──────────────────────────────────────────────────────────────────────

    async def _association(self, target: Mapping[str, str], params: SlurmEnforceParams
                           ) -> dict[str, str]:
        """The association's current fields (as ``set`` names them)."""
        where = _where(target, params)
        fields = ["Cluster", "Account", "User", *FORMAT_FIELDS.values()]
        done = await self._run(["sacctmgr", "--noheader", "--parsable2", "show", "assoc",
                                *where, f"format={','.join(fields)}"])
        if done.returncode != 0:
            raise RuntimeError(f"sacctmgr show assoc failed: {done.stderr.strip()[:200]}")
        found = [values for values in (dict(zip(fields, line.split("|"), strict=False))
                                       for line in done.stdout.splitlines())
                 if values.get("User", "") == target.get("user", "")]
        if not found:
            raise NotEnforceable("failed", f"Slurm has no association for {_who(target)}")
        if len(found) > 1:
            # One modify would set them all, and the lift would give them all the first's
            # values back: name the one meant.
            places = ", ".join(f"cluster {v.get('Cluster', '?')} account {v.get('Account', '?')}"
                               for v in found)
            raise NotEnforceable("failed", f"{_who(target)} has {len(found)} associations "
                                 f"({places}): set cluster (and account_tag) to name one")
        return {name: found[0].get(shown, "") for name, shown in FORMAT_FIELDS.items()}

    async def _modify(self, target: Mapping[str, str], params: SlurmEnforceParams,
                      settings: Mapping[str, str]) -> None:
        entity = ["user", "where", f"name={target['user']}"] if "user" in target else [
            "account", "where", f"name={target['account']}"]
        if "user" in target and "account" in target:
            entity.append(f"account={target['account']}")
        if params.cluster:
            entity.append(f"cluster={params.cluster}")
        argv = ["sacctmgr", "--immediate", "modify", *entity, "set",
                *(f"{field}={value}" for field, value in settings.items())]
        done = await self._run(argv)
        if done.returncode != 0 and "nothing modified" not in (done.stdout + done.stderr).lower():
            problem = (done.stderr or done.stdout).strip()[:200]
            raise RuntimeError(f"sacctmgr modify failed: {problem}")


def _params(plan: EnforcePlan) -> SlurmEnforceParams:
    return SlurmEnforceParams.model_validate(plan.params)


def _where(target: Mapping[str, str], params: SlurmEnforceParams) -> list[str]:
    where = ["where"]
    if "account" in target:
        where.append(f"account={target['account']}")
    if "user" in target:
        where.append(f"user={target['user']}")
    if params.cluster:
        where.append(f"cluster={params.cluster}")
    return where


def _who(target: Mapping[str, str]) -> str:
    parts = [f"Slurm {key} {target[key]}" for key in ("account", "user") if key in target]
    return " / ".join(parts) or "?"


def _settings_text(settings: Mapping[str, str]) -> str:
    return " ".join(f"{k}={v or '(none)'}" for k, v in settings.items()) or "nothing"


def _job_ids(before: Mapping[str, Any]) -> list[str]:
    return [key.removeprefix(JOB) for key in before if key.startswith(JOB)]
