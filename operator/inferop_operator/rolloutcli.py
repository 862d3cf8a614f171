"""`inferop rollout status|promote|abort|retry|pause|resume NAME`: see and steer the rollout of an InferenceService.

Each action writes the spec field the operator acts on, as `kubectl patch` would (docs/how-to/rollouts.md): promote
ends the current step (spec.rollout.endStep naming the candidate and its step), `promote --full` every remaining one
(spec.rollout.promote naming the candidate), abort rolls back (spec.rollout.abort), retry starts a rolled-back
candidate again (spec.rollout.retry; abort, promote and endStep removed), pause and resume set spec.rollout.paused.
It then waits for the status to show that the operator took it up and says how long that took. An action the
rollout's phase does not allow is refused before anything is written, naming the phase. Exit codes: 0 taken up,
1 not taken up within --timeout, 2 refused or invalid.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from inferop_core.errors import InferopError
from inferop_operator.identity import API_VERSION, KIND
from inferop_operator.kubeapi import KubeApi, load_client
from inferop_operator.rollout import CANDIDATE_PHASES, FINAL_PHASES, RolloutStatus

POLL_SECONDS = 0.25  # how often the status is read while waiting for the operator
FIELD_MANAGER = "inferop-rollout"


class RolloutCommandError(InferopError):
    """An action the InferenceService's rollout does not allow now, or an InferenceService that is not there."""


@dataclass(frozen=True)
class Action:
    """A change of spec.rollout and the status that shows the operator took it up."""

    phases: frozenset[str]  # the phases in which it applies
    spec: Callable[[RolloutStatus], dict[str, Any]]  # the spec.rollout fields it writes (None: removed)
    taken: Callable[[RolloutStatus], Callable[[RolloutStatus], bool]]  # from the status before, is it taken up now
    done: str  # what it did, for the report


def step_ended(before: RolloutStatus) -> Callable[[RolloutStatus], bool]:
    """The step `before` was at has given way: the next one's pods are starting or its traffic is in effect, or
    the candidate is being promoted."""

    def ended(now: RolloutStatus) -> bool:
        moved_on = now.step is not None and before.step is not None and now.step > before.step
        return moved_on or now.scaling_for is not None or now.phase in ("Promoting", "Finishing", "Succeeded")

    return ended


ACTIONS: dict[str, Action] = {
    "promote": Action(
        frozenset({"Progressing", "Paused"}),
        lambda state: {"endStep": f"{state.candidate}/{state.step or 0}"},
        step_ended,
        "moved on: its step ended, the next begins once the candidate's pods for it are Ready",
    ),
    "promote --full": Action(
        frozenset({"Progressing", "Paused"}),
        lambda state: {"promote": state.candidate},
        lambda before: lambda now: now.phase in ("Promoting", "Finishing", "Succeeded"),
        "promoted: the stable Deployment takes its spec",
    ),
    "retry": Action(
        frozenset({"RolledBack"}),
        # What would end the new attempt at once goes: an abort, a promotion or a step ended, naming the candidate.
        lambda state: {
            "retry": f"{state.candidate}/{int(time.time())}",
            "abort": None,
            "promote": None,
            "endStep": None,
        },
        lambda before: lambda now: now.phase in CANDIDATE_PHASES - {"RollingBack"},
        "started again: its pods start beside the stable revision, and it gets no traffic before it agrees",
    ),
    "abort": Action(
        CANDIDATE_PHASES - {"RollingBack"},
        lambda state: {"abort": state.candidate},
        lambda before: lambda now: now.phase in ("RollingBack", "RolledBack"),
        "aborted: no traffic to it from now, its pods drain",
    ),
    "pause": Action(
        frozenset({"Agreement", "Progressing", "Paused"}),
        lambda state: {"paused": True},
        # In Agreement nothing moves yet: the rollout holds at its first step once the check passed.
        lambda before: lambda now: now.reason == "PausedBySpec" or now.phase == "Agreement",
        "held at its step (a failing analysis still rolls it back)",
    ),
    "resume": Action(
        frozenset({"Agreement", "Progressing", "Paused"}),
        lambda state: {"paused": False},
        lambda before: lambda now: now.reason != "PausedBySpec",
        "resumed",
    ),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action",
        choices=["status", "promote", "abort", "retry", "pause", "resume"],
        help="see the rollout, or steer it",
    )
    parser.add_argument(
        "--full", action="store_true", help="promote: every remaining step skipped, not only the current one"
    )
    parser.add_argument("name", help="the InferenceService")
    parser.add_argument("-n", "--namespace", default="default", help="its namespace (default: default)")
    parser.add_argument("--watch", action="store_true", help="status: print each change until the rollout ends")
    parser.add_argument("--json", action="store_true", help="status: status.rollout as JSON")
    parser.add_argument(
        "--timeout", type=float, default=30.0, help="seconds to wait for the operator to take an action up"
    )


def run(args: argparse.Namespace) -> int:
    api = KubeApi(load_client(1), FIELD_MANAGER)
    if args.action == "status":
        return show(api, args.namespace, args.name, args.watch, args.json)
    action = "promote --full" if args.action == "promote" and args.full else args.action
    return steer(api, args.namespace, args.name, action, args.timeout)


def rollout_of(api: KubeApi, namespace: str, name: str) -> tuple[dict[str, Any], RolloutStatus]:
    found = api.get(API_VERSION, KIND, namespace, name)
    if found is None:
        raise RolloutCommandError(f"InferenceService {name} not found in namespace {namespace}")
    return found, RolloutStatus.model_validate((found.get("status") or {}).get("rollout") or {})


def check_action(name: str, action: str, spec: dict[str, Any], state: RolloutStatus) -> None:
    """Refuses what the operator would ignore, naming why."""
    if spec.get("rollout") is None:
        raise RolloutCommandError(f"{name} has no spec.rollout: a change of it rolls its Deployment, with no steps")
    if state.phase not in ACTIONS[action].phases:
        allowed = ", ".join(sorted(ACTIONS[action].phases))
        where = f"its rollout is {state.phase}" if state.phase else "no rollout has started"
        raise RolloutCommandError(f"cannot {action} {name}: {where} (only in {allowed})")


def steer(api: KubeApi, namespace: str, name: str, action: str, timeout: float) -> int:
    found, state = rollout_of(api, namespace, name)
    check_action(name, action, found.get("spec") or {}, state)
    wanted = ACTIONS[action]
    taken = wanted.taken(state)
    written = time.monotonic()
    api.patch_spec(namespace, name, {"rollout": wanted.spec(state)})
    while True:
        _, now = rollout_of(api, namespace, name)
        took = time.monotonic() - written
        if taken(now):
            print(f"{name}: revision {state.candidate} {wanted.done} ({now.phase}, {took:.1f} s after the patch)")
            return 0
        if took > timeout:
            print(
                f"{name}: spec.rollout written, but the status still reads {now.phase} ({now.reason}) after "
                f"{timeout:g} s: is the operator running?"
            )
            return 1
        time.sleep(POLL_SECONDS)


def describe(state: RolloutStatus, steps: list[int]) -> str:
    """The rollout in a few lines, as `status` prints it."""
    if state.phase is None:
        return f"no rollout yet; stable revision {state.stable or '(none)'}"
    lines = [f"{state.phase}: {state.reason or ''} {state.message or ''}".rstrip()]
    lines.append(f"stable {state.stable}, candidate {state.candidate}")
    if state.phase not in FINAL_PHASES:
        at = f"step {state.step + 1} of {len(steps)}, " if state.step is not None and steps else ""
        extra = [f"{state.mirror_percent}% mirrored"] if state.mirror_percent else []
        extra += ["header-matched callers to the candidate"] if state.header else []
        lines.append(f"{at}{state.weight}% of requests to the candidate" + "".join(f", {e}" for e in extra))
    if state.scaling_for is not None:
        lines.append(f"waiting for the candidate's pods for {state.scaling_for}% of requests to be Ready")
    if state.analysis is not None:
        judged = state.analysis
        lines.append(f"last analysis (step {judged.step + 1}, {judged.weight}%): {judged.verdict}: {judged.message}")
    return "\n".join(lines)


def show(api: KubeApi, namespace: str, name: str, watch: bool, as_json: bool) -> int:
    last = None
    while True:
        found, state = rollout_of(api, namespace, name)
        steps = list(((found.get("spec") or {}).get("rollout") or {}).get("steps") or [])
        text = (
            json.dumps(state.model_dump(by_alias=True, exclude_none=True, mode="json"), indent=2)
            if as_json
            else describe(state, steps)
        )
        if text != last:
            print(text + ("\n" if watch else ""), flush=True)
            last = text
        if not watch or state.phase in FINAL_PHASES or state.phase is None:
            return 0
        time.sleep(1.0)
