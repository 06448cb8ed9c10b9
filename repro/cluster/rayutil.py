"""Ray for repro's executors: is it installed, is the cluster there, connect, ask for resources, node
facts; and for those whose unit of work is one task (a matrix run, a bisect probe, a sweep): running a
task in a scratch directory whose files go back to the driver as archives, waiting for tasks as
they end (failing those no live node can take), taking what a generator task yields as it comes, and
cancelling them.

Shared by `repro matrix --executor ray` (repro.matrix.ray_executor), `repro run --executor ray`
(repro.run.rayshards), `repro bisect --executor ray` (repro.bisect.executor) and `repro sweep --executor
ray` (repro.sweep.runner). Ray is imported only inside `connect`: a usage error never waits for it, and
repro works without the `cluster` extra.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import shutil
import socket
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Literal, get_args

from rich.console import Console
from rich.text import Text

from repro.errors import UsageError

CANCEL_GRACE_S = 60.0
"""After Ctrl-C, how long the tasks get to stop their deployments before they are killed."""
SCRATCH = "\x00scratch\x00"
"""Stands for a task's scratch directory in what it printed; the driver puts its own directory there."""
CONNECT_CHECK_S = 10.0
UNPLACEABLE_AFTER_S = 10.0
"""A task no live node can take fails after this long (an autoscaler may add such a node meanwhile)."""
LOOPBACK = ("127.0.0.1", "localhost", "::1")
LOCAL_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
RAY_NAMES = {"CPU": "num_cpus", "GPU": "num_gpus", "memory": "memory"}
"""Resources Ray takes as task options of their own; any other name is a custom resource."""
DEFAULT_RESOURCES = {"CPU": 1.0}
"""What a task asks for when nothing says otherwise (as a matrix spec's `resources.run`)."""


Executor = Literal["local", "ray"]
"""What `--executor` names: this machine, or a Ray cluster."""
EXECUTORS: tuple[str, ...] = get_args(Executor)


def check_executor(executor: str) -> None:
    """UsageError unless `executor` is one of EXECUTORS."""
    if executor not in EXECUTORS:
        raise UsageError(f"--executor {executor!r}: expected one of {', '.join(EXECUTORS)}")


def task_options(resources: dict[str, float]) -> dict[str, Any]:
    """Ray task (or actor) options asking for `resources` (names: CPU, GPU, memory, custom ones)."""
    options: dict[str, Any] = {"num_cpus": 0}
    custom: dict[str, float] = {}
    for name, amount in resources.items():
        if name in RAY_NAMES:
            options[RAY_NAMES[name]] = amount
        else:
            custom[name] = amount
    if custom:
        options["resources"] = custom
    return options


def is_amount(value: object) -> bool:
    """Whether `value` can be a Ray resource amount: a finite number, at least 0 (a bool is no number here)."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and 0 <= value < float("inf")


def error_line(err: BaseException) -> str:
    """A Ray error on one line: its type and the first line of its text (Ray appends tracebacks)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[0] if lines else ''}"


def parse_resources(text: str, *, option: str = "--resources") -> dict[str, float]:
    """`{"GPU": 8, "h100": 1}` from the command line: a JSON object of resource names and amounts >= 0."""
    try:
        value = json.loads(text)
    except ValueError as err:
        raise UsageError(f"{option} {text!r}: not JSON ({err.msg}); expected e.g. '{{\"GPU\": 8}}'") from None
    if not isinstance(value, dict) or not value:
        raise UsageError(f"{option} {text!r}: expected a JSON object of resource names and amounts, e.g. '{{\"GPU\": 8}}'")
    for name, amount in value.items():
        if not is_amount(amount):
            raise UsageError(f"{option}: {name!r} must be a number >= 0, got {json.dumps(amount)}")
    return {name: float(amount) for name, amount in value.items()}


def asked_resources(
    executor: str, *, ray_address: str | None, resources: str | None,
    fallback: Callable[[], dict[str, float]] | None = None, local_note: str = "",
) -> dict[str, float] | None:
    """What `--executor`, `--ray-address` and `--resources` ask of a command whose work is Ray tasks, checked
    before it makes its directory: None for the local executor (which refuses the two options; `local_note`
    says why for `--resources`), else what each task asks for (`--resources` JSON, else `fallback()`,
    else one CPU), once Ray is there to answer at `ray_address`."""
    check_executor(executor)
    if executor == "local":
        if ray_address is not None:
            raise UsageError("--ray-address needs --executor ray")
        if resources is not None:
            raise UsageError(f"--resources needs --executor ray{local_note}")
        return None
    if resources is not None:
        asked = parse_resources(resources)
    else:
        asked = fallback() if fallback is not None else dict(DEFAULT_RESOURCES)
    require_ray(ray_address)
    return asked


def require_ray(address: str | None) -> None:
    """UsageError unless Ray is installed (the `cluster` extra) and something answers at `address`.

    Checked before a run or matrix directory is made; Ray itself is imported only to connect.
    """
    if importlib.util.find_spec("ray") is None:
        raise UsageError("--executor ray needs Ray: pip install 'repro[cluster]'")
    if address and address not in ("auto", "local"):
        _check_reachable(address)


def _check_reachable(address: str) -> None:
    """UsageError at once when nothing answers at HOST:PORT (Ray would retry it for minutes)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"--ray-address {address}: expected HOST:PORT (the head node's GCS address)")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_CHECK_S) as sock:
            reply = speaks_grpc(sock)
    except OSError as err:
        raise UsageError(f"--ray-address {address}: nothing answers there ({err.strerror or err})") from None
    if reply is not None:
        raise UsageError(f"--ray-address {address}: {reply}, so it is not a Ray head (its GCS speaks gRPC); "
                         f"give the head's HOST:PORT (6379 unless it was started with another --port)")


_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes.fromhex("000000040000000000")
"""The client preface of HTTP/2 (gRPC's transport) and an empty SETTINGS frame."""


def speaks_grpc(sock: socket.socket) -> str | None:
    """None when the peer answers the HTTP/2 preface with a SETTINGS frame, as every gRPC server (a Ray GCS,
    a Ray client server) does at once; otherwise what it did instead. Bounded by the socket's timeout: a
    port that accepts and stays silent would otherwise hold `ray.init` for many minutes."""
    try:
        sock.sendall(_HTTP2_PREFACE)
        head = b""
        while len(head) < 9:
            chunk = sock.recv(9 - len(head))
            if not chunk:
                return "it closed the connection on an HTTP/2 greeting"
            head += chunk
    except TimeoutError:
        return f"it accepted the connection but answered nothing within {sock.gettimeout():g}s"
    return None if head[3] == 0x04 else "it does not answer in HTTP/2"


def connect(address: str | None) -> tuple[Any, bool]:
    """The `ray` module, connected; True when this call connected it (and should disconnect)."""
    host = (address or "").rpartition(":")[0].strip("[]")
    if host in LOOPBACK and "ray" not in sys.modules:
        # Ray rewrites a loopback address to the machine's outward one before connecting, which a
        # Ray bound to loopback does not answer. This switch (read when ray is imported) keeps loopback.
        os.environ.setdefault(LOCAL_ONLY_ENV, "0")
    import ray
    if ray.is_initialized():
        return ray, False
    try:
        # No address: a one-machine Ray started here and stopped at the end (RAY_ADDRESS is honoured).
        ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise UsageError(f"--ray-address {address}: cannot connect to Ray: {str(err).splitlines()[0]}") from None
    return ray, True


@contextlib.contextmanager
def connected(address: str | None) -> Iterator[Any]:
    """`connect` for a block: the `ray` module, disconnected at the end when the block connected it."""
    ray, owned = connect(address)
    try:
        yield ray
    finally:
        if owned:
            ray.shutdown()


def fits(asked: dict[str, float], node: dict[str, float]) -> bool:
    """Whether a node with resources `node` (Ray's names) can take a request of `asked` (Ray's names too)."""
    return all(node.get(name, 0.0) >= amount for name, amount in asked.items() if amount > 0)


def alive_nodes(ray: Any) -> list[dict[str, Any]]:
    """`ray.nodes()` entries of the nodes alive now (NodeID, NodeManagerAddress, Resources, ...)."""
    return [node for node in ray.nodes() if node.get("Alive")]


def absolute_workload(options: dict[str, Any]) -> dict[str, Any]:
    """Load options with their workload path made absolute: a Ray worker does not run in the driver's directory."""
    if options.get("workload"):
        return {**options, "workload": str(Path(options["workload"]).resolve())}
    return options


def submit(ray: Any, function: Any, resources: dict[str, float], name: str, *args: Any) -> Any:
    """Start `function(*args)` as a Ray task asking for `resources`; never retried (a lost task is a
    failed one, which the command records and `--resume` reruns). Its ObjectRef."""
    remote = ray.remote(max_retries=0)(function)
    return remote.options(**task_options(resources), name=name).remote(*args)


@contextlib.contextmanager
def scratch(prefix: str) -> Iterator[Path]:
    """In a task: a fresh directory on the node, removed with everything in it after the block."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def captured() -> tuple[Console, io.StringIO]:
    """In a task: a console whose output goes back to the driver, wide enough that a path never wraps
    (the scratch directory's path in it is replaced by the driver's directory)."""
    screen = io.StringIO()
    return Console(file=screen, width=400, highlight=False), screen


def printed(screen: io.StringIO, directory: Path) -> str:
    """What a task printed, with its scratch `directory` marked for the driver to replace."""
    return screen.getvalue().replace(str(directory), SCRATCH)


def replay(console: Console, text: str, directory: Path) -> None:
    """Print on the driver what a task printed, naming `directory` where the task named its scratch."""
    for line in text.replace(SCRATCH, str(directory)).splitlines():
        console.print(Text(line), soft_wrap=True)  # laid out on the node already


def pack(directory: Path, tops: tuple[str, ...] | None = None) -> bytes:
    """A tar.gz of `directory` (only its entries `tops` when given)."""
    archive = io.BytesIO()
    names = tops if tops is not None else tuple(sorted(p.name for p in directory.iterdir()))
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        for top in names:
            if (directory / top).exists():
                tar.add(directory / top, arcname=top)
    return archive.getvalue()


def unpack(archive: bytes, path: Path) -> None:
    """Extract what `pack` made into `path` (refusing absolute paths, links out of it, devices)."""
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        tar.extractall(path, filter="data")


def _unplaceable(ray: Any, asked: dict[Any, dict[str, float]], ready: list[Any], since: dict[Any, float]) -> list[Any]:
    """Tasks that no live node could run for UNPLACEABLE_AFTER_S: Ray would keep them pending for ever
    (the node that had the resource died, or none ever had it)."""
    totals = [node["Resources"] for node in alive_nodes(ray)]
    now = time.monotonic()
    out = []
    for ref, resources in asked.items():
        if ref in ready or any(fits(resources, node) for node in totals):
            since.pop(ref, None)
        elif now - since.setdefault(ref, now) >= UNPLACEABLE_AFTER_S:
            out.append(ref)
    return out


UNPLACEABLE = f"no live node of the cluster has the resources asked for, for {UNPLACEABLE_AFTER_S:g}s"


def _why(text: str, resources: dict[str, float]) -> str:
    """Why a task ended without its value, naming what it asked for."""
    return f"{text}; resources {resources}"


def as_completed(ray: Any, asked: dict[Any, dict[str, float]], console: Console) -> Iterator[tuple[Any, Any, str | None]]:
    """`(ref, value, None)` for each task of `asked` (its ref: its resources) as it ends, or
    `(ref, None, why)` when it ended without a value (its node or worker died) or no live node can
    take it (`why` names the resources). Leaving early (Ctrl-C, an error, `close()`) cancels the tasks still out."""
    out = dict(asked)
    waiting: dict[Any, float] = {}
    try:
        while out:
            ready, _ = ray.wait(list(out), num_returns=1, timeout=1.0)
            for ref in _unplaceable(ray, out, ready, waiting):
                resources = out.pop(ref)
                ray.cancel(ref, force=False)
                yield ref, None, _why(UNPLACEABLE, resources)
            for ref in ready:
                resources = out.pop(ref)
                try:
                    value = ray.get(ref)
                except ray.exceptions.RayError as err:
                    yield ref, None, _why(f"the Ray task ended without a result ({error_line(err)})", resources)
                    continue
                yield ref, value, None
    finally:
        cancel(ray, list(out), console)


def streamed(ray: Any, task: Any, resources: dict[str, float], console: Console) -> Iterator[tuple[Any, str | None]]:
    """`(value, None)` for each value a generator task (`submit` of a generator function) yields, as it
    comes; then, when the task ended before it finished (its node or worker died) or no live node can
    take it, one `(None, why)` (`why` names the resources). Leaving early (Ctrl-C, an error, `close()`)
    cancels the task."""
    out = [task]
    waiting: dict[Any, float] = {}
    try:
        while True:
            ready, _ = ray.wait(out, num_returns=1, timeout=1.0)
            if not ready:
                if _unplaceable(ray, {task: resources}, [], waiting):
                    out.clear()
                    ray.cancel(task, force=False)
                    yield None, _why(UNPLACEABLE, resources)
                    return
                continue
            try:
                ref = next(task)
            except StopIteration:
                out.clear()
                return
            try:
                value = ray.get(ref)
            except ray.exceptions.RayError as err:
                out.clear()
                yield None, _why(f"the Ray task ended before it finished ({error_line(err)})", resources)
                return
            yield value, None
    finally:
        cancel(ray, out, console)


def cancel(ray: Any, refs: list[Any], console: Console) -> None:
    """Stop the tasks still out: Ctrl-C in each (its deployment stops), then force after CANCEL_GRACE_S."""
    if not refs:
        return
    console.print(Text(f"cancelling {len(refs)} Ray task(s)"))
    for ref in refs:
        ray.cancel(ref, force=False)
    # A generator task is "ready" while it has values to take; only its completion says it has stopped.
    ends = {ref.completed() if isinstance(ref, ray.ObjectRefGenerator) else ref: ref for ref in refs}
    deadline = time.monotonic() + CANCEL_GRACE_S
    left = list(ends)
    while left and time.monotonic() < deadline:
        _, left = ray.wait(left, num_returns=len(left), timeout=0.5)
    for end in left:
        ray.cancel(ends[end], force=True)
