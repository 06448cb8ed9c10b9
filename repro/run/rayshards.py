"""`repro run --executor ray --workers N`: the shard workers as Ray actors (a transport of repro.run.shards).

Each worker is one `ShardActor`, placed by Ray on a node that has the resources it asks for
(`--worker-resources`; default one CPU). The actor plays its share with `repro.run.shards.play_shard` in
a thread of its own (its own event loop, so its loop lag is the load's alone) and keeps the frames in
a queue; the driver pulls them in batches (`take`), one call in flight per actor, and applies them
exactly as it applies a local worker's. An actor whose call fails (its node died, its process was
killed) is a lost worker: repro.run.shards turns its sessions in flight into `error` records.

Ctrl-C: the driver asks every actor to stop (its sessions in flight come back as `interrupted`),
waits for their last frames, and kills every actor at the end of the run whatever happened; Ray
also kills them if the driver itself dies, since they are the driver's (not detached) actors.

A target on loopback (the embedded simulator, a 127.0.0.1 `--base-url`) answers only on this
machine: such a run is refused when the cluster has a node elsewhere, since Ray may place a worker
there (see `off_machine`).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from typing import Any, AsyncIterator
from urllib.parse import urlsplit

import anyio

from repro.cluster.node import where
from repro.cluster.rayutil import LOOPBACK, alive_nodes, error_line, fits, task_options
from repro.errors import InternalError, UsageError
from repro.run.shards import Frame, Link, ShardJob, Transport, play_shard

PLACE_TIMEOUT_S = 120.0
"""Time for every actor to be placed and started (Ray may start a worker process on a node for each)."""
TAKE_WAIT_S = 0.25
"""How long one `take` waits for a frame before answering with none."""
TAKE_EVERY_S = 0.1
"""Least time between two `take`s of one actor: frames come in batches rather than one call each, so the
calls' work in the actor's process (Ray's threads share its GIL with the load's event loop) stays small."""


class ShardActor:
    """In a Ray worker process: one shard worker. `start` plays the job in a thread; `take` hands its frames over."""

    def __init__(self) -> None:
        self._frames: deque[Frame] = deque()
        self._ready = threading.Condition()
        self._error: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: anyio.Event | None = None
        self._stop_asked = False

    def where(self) -> dict[str, str]:
        return where()

    def start(self, job: ShardJob) -> None:
        threading.Thread(target=self._play, args=(job,), name="repro-shard", daemon=True).start()

    def take(self, wait_s: float) -> list[Frame]:
        """The frames so far (waiting up to `wait_s` for one); raises once the worker failed and all is taken."""
        with self._ready:
            self._ready.wait_for(lambda: self._frames or self._error is not None, timeout=wait_s)
            batch = list(self._frames)
            self._frames.clear()
            if not batch and self._error is not None:
                raise RuntimeError(self._error)
        return batch

    def stop(self) -> None:
        with self._ready:
            self._stop_asked = True
            if self._loop is not None and self._stop is not None:
                self._loop.call_soon_threadsafe(self._stop.set)

    def _emit(self, frame: Frame) -> None:
        with self._ready:
            self._frames.append(frame)
            self._ready.notify()

    def _play(self, job: ShardJob) -> None:
        async def play() -> None:
            stop = anyio.Event()
            with self._ready:
                self._loop, self._stop = asyncio.get_running_loop(), stop
                if self._stop_asked:
                    stop.set()
            await play_shard(job, self._emit, stop)

        try:
            anyio.run(play)
        except BaseException as err:  # noqa: BLE001 - reported to the driver, which names the worker lost
            with self._ready:
                self._error = f"{type(err).__name__}: {err}"
                self._ready.notify()


class _ActorLink:
    """One actor as the driver reaches it."""

    def __init__(self, ray: Any, actor: Any, node: dict[str, str]) -> None:
        self.ray = ray
        self.actor = actor
        self.node = node
        self._lost = "the actor ended"

    async def begin(self, job: ShardJob) -> None:
        try:
            await anyio.to_thread.run_sync(self.ray.get, self.actor.start.remote(job))
        except self.ray.exceptions.RayError as err:
            self._lost = error_line(err)
            self.actor = None  # gone before its first frame: `frames` yields none

    async def frames(self) -> AsyncIterator[Frame]:
        while self.actor is not None:
            ref = self.actor.take.remote(TAKE_WAIT_S)
            try:
                batch = await anyio.to_thread.run_sync(self.ray.get, ref, abandon_on_cancel=True)
            except self.ray.exceptions.RayError as err:
                self._lost = error_line(err)
                return
            for message in batch:
                yield message
                if message[0] == "done":
                    return
            await anyio.sleep(TAKE_EVERY_S)

    async def stop(self) -> None:
        if self.actor is not None:
            self.actor.stop.remote()

    async def lost(self) -> str:
        return self._lost


def ray_actors(ray: Any, resources: list[dict[str, float]]) -> Transport:
    """The Ray transport: worker k asks for `resources[k]` (check them first with `check_resources`)."""

    @contextlib.asynccontextmanager
    async def start(workers: int) -> AsyncIterator[list[Link]]:
        asked = resources[:workers]
        remote = ray.remote(ShardActor)
        actors = [
            remote.options(**task_options(wanted), max_concurrency=4, max_restarts=0).remote()
            for wanted in asked
        ]
        try:
            try:
                placed = await anyio.to_thread.run_sync(
                    lambda: ray.get([actor.where.remote() for actor in actors], timeout=PLACE_TIMEOUT_S),
                    abandon_on_cancel=True,
                )
            except ray.exceptions.GetTimeoutError:
                raise UsageError(f"--executor ray: the cluster did not start {workers} worker(s) within "
                                 f"{PLACE_TIMEOUT_S:g}s; is it busy?") from None
            except ray.exceptions.RayError as err:
                raise InternalError(f"--executor ray: a worker failed to start: {error_line(err)}") from None
            yield [_ActorLink(ray, actor, node) for actor, node in zip(actors, placed)]
        finally:
            for actor in actors:
                ray.kill(actor, no_restart=True)

    return start


def check_resources(ray: Any, asked: list[dict[str, float]]) -> None:
    """UsageError when a worker asks for more than any live node of the cluster has."""
    nodes = [node["Resources"] for node in alive_nodes(ray)]
    for index, wanted in enumerate(asked):
        if not any(fits(wanted, node) for node in nodes):
            ask = ", ".join(f"{name}={amount:g}" for name, amount in wanted.items())
            raise UsageError(f"--worker-resources: no live node of the cluster has what worker {index} asks for ({ask})")


def off_machine(target_host: str, driver_address: str, node_addresses: list[str]) -> list[str]:
    """The node addresses that cannot reach a target on this machine's loopback: those of other machines.

    Nodes started on this machine (Ray's test cluster, `ray start` here) share the driver's address,
    or are bound to loopback themselves; a target that is not on loopback is left to the user.
    """
    if target_host not in LOOPBACK:
        return []
    return sorted({address for address in node_addresses if address not in (driver_address, *LOOPBACK)})


def check_target(ray: Any, base_url: str) -> None:
    """UsageError when the target is on loopback and the cluster has nodes on other machines."""
    host = urlsplit(base_url).hostname or ""
    me = ray.get_runtime_context().get_node_id()
    nodes = alive_nodes(ray)
    driver = next((node["NodeManagerAddress"] for node in nodes if node["NodeID"] == me), "")
    others = off_machine(host, driver, [node["NodeManagerAddress"] for node in nodes])
    if others:
        raise UsageError(
            f"--executor ray: the target {base_url} is on this machine's loopback, which the cluster's nodes at "
            f"{', '.join(others)} cannot reach; give --base-url an address every node reaches"
        )
