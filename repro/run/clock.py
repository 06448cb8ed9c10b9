"""The harness's side of the simulator's virtual clock: declare the load, tag turns, end sessions.

A simulator started with `--clock virtual` reports `clock: virtual` in `/server_info`. Against it, the run
declares each wave's load before starting it, every turn carries its session in a header, and each session
says when it is over; the simulator then steps only when the sessions it expects are all in, so its
schedule (and its faults) no longer depend on how loaded this machine is (repro.sim.lockstep). Against
any other server none of this happens.
"""

from __future__ import annotations

from typing import Any

from repro.errors import TargetError
from repro.run.metrics import server_root
from repro.sim.lockstep import SESSION_HEADER

CLOCK_TIMEOUT_S = 10.0


def clock_url(server_info: dict[str, Any] | None, base_url: str) -> str | None:
    """Where to declare the load, when the target is a simulator on the virtual clock; None otherwise."""
    if server_info is None or server_info.get("simulator") is not True or server_info.get("clock") != "virtual":
        return None
    return server_root(base_url) + "/sim/clock"


def session_headers(session_id: int) -> dict[str, str]:
    return {SESSION_HEADER: str(session_id)}


async def declare(url: str, sessions: int, concurrency: int) -> None:
    """Tell the simulator the load about to run; a simulator that does not take it is a target error."""
    import httpx  # here, not at the top: every session imports this module (see repro.procs.process)

    try:
        async with httpx.AsyncClient(trust_env=False) as client:
            response = await client.post(f"{url}/plan", json={"sessions": sessions, "concurrency": concurrency},
                                         timeout=CLOCK_TIMEOUT_S)
    except httpx.HTTPError as err:
        raise TargetError(f"the simulator's virtual clock did not take the load: {type(err).__name__}: {err}") from None
    if response.status_code != 200:
        raise TargetError(f"the simulator's virtual clock did not take the load: HTTP {response.status_code}")


async def end(url: str, session_id: int) -> None:
    """Tell the simulator a session sends no more turns. Best effort: a lost notice costs the simulator its
    patience (and it then says the schedule is not reproducible), not the session its record."""
    import httpx

    try:
        async with httpx.AsyncClient(trust_env=False) as client:
            await client.post(f"{url}/ended", json={"session": str(session_id)}, timeout=CLOCK_TIMEOUT_S)
    except httpx.HTTPError:
        pass
