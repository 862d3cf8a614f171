"""`inferop rollout status|promote|abort|pause|resume NAME`: see and steer the rollout of an InferenceService.

Each action writes the spec field the operator already acts on (spec.rollout.promote and .abort naming the
candidate revision, spec.rollout.paused), as `kubectl patch` would (docs/how-to/rollouts.md), then waits for the
status to show that the operator took it up and says how long that took. An action the rollout's phase does not
allow is refused before anything is written, naming the phase. Exit codes: 0 taken up, 1 not taken up within
--timeout, 2 refused or invalid.
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
    spec: Callable[[RolloutStatus], dict[str, Any]]  # the spec.rollout fields it writes
    taken: Callable[[RolloutStatus], bool]
    done: str  # what it did, for the report


ACTIONS: dict[str, Action] = {
    "promote": Action(
        frozenset({"Progressing", "Paused"}),
        lambda state: {"promote": state.candidate},
        lambda state: state.phase in ("Promoting", "Finishing", "Succeeded"),
        "promoted: the stable Deployment takes its spec",
    ),
    "abort": Action(
        CANDIDATE_PHASES - {"RollingBack"},
        lambda state: {"abort": state.candidate},
        lambda state: state.phase in ("RollingBack", "RolledBack"),
        "aborted: no traffic to it from now, its pods drain",
    ),
    "pause": Action(
        frozenset({"Agreement", "Progressing", "Paused"}),
        lambda state: {"paused": True},
        # In Agreement nothing moves yet: the rollout holds at its first step once the check passed.
        lambda state: state.reason == "PausedBySpec" or state.phase == "Agreement",
        "held at its step (a failing analysis still rolls it back)",
    ),
    "resume": Action(
        frozenset({"Agreement", "Progressing", "Paused"}),
        lambda state: {"paused": False},
        lambda state: state.reason != "PausedBySpec",
        "resumed",
    ),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["status", *ACTIONS], help="see the rollout, or steer it")
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
    return steer(api, args.namespace, args.name, args.action, args.timeout)


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
    written = time.monotonic()
    api.patch_spec(namespace, name, {"rollout": wanted.spec(state)})
    while True:
        _, now = rollout_of(api, namespace, name)
        took = time.monotonic() - written
        if wanted.taken(now):
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
