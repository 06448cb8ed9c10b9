"""repro's client against its peers, guidellm and AIPerf, on the same paced streams in one run.

Each peer is installed at a pinned version into its own virtual environment, cached between runs
under ~/.cache/repro-peers/NAME-VERSION (or $REPRO_PEERS_CACHE), with uv (installed once into
~/.cache/repro-peers/uv: pip's resolver takes tens of minutes over guidellm's dependencies, uv
seconds). The peers are never dependencies of repro. Their Hugging Face tokenizer is the tiny
DeepSeek-style one of examples/vllm-cpu/build_model.py, trained offline with the peer's own
`tokenizers` the first time and cached beside the environments.

For every level C (streams at once), each client runs in its own process against its own fresh
benchmarks/fast_stream_server.py (first chunk at --ttft, then --chunks content chunks --interval
apart): repro as `repro run` with C sessions of --turns turns; a peer with C concurrent requests,
C x --turns in all. Measured per client and level:

- client CPU: user + system seconds of the client's process and the children it reaped (os.wait4),
  divided by the content chunks the server sent it (the server's own count, GET /stats), all of it
  counted, and past start-up: less a run of one stream as long as the level's (--turns requests),
  which takes the start-up (imports, tokenizer, the peer's worker processes) and what the client
  spends merely running. The peers spend CPU for as long as they run, as much as the machine leaves
  them, so their figure past start-up also holds the change in spare CPU between the two runs;
- timing overhead at p99: the client's own TTFT p99 minus the server's --ttft (the server sends the
  first chunk exactly then, so the excess is the client's and the machine's distortion);
- whether the level holds: every stream finished and the timing overhead under the lag limit (50 ms,
  as benchmarks/bench_workers.py's TTFT limit). Each client climbs the levels until one does not hold.

The table at the end gives each peer's figures as ratios to repro's (CPU per chunk and overhead at
the largest level every client ran; streams held at the largest level each held). A peer that cannot
be installed or run gets one line saying why; the other rows stay.

Usage: `python benchmarks/peers.py [--levels 100,200,400,800] [--turns 2] [--peers guidellm,aiperf]`;
`--peers none` runs repro alone and installs nothing (what CI runs). Prints numbers only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from _child import run_child
from bench_client import LAG_LIMIT_S, start_server

from repro.procs.limits import ensure_open_files
from repro.store.rundir import load_run

ROOT = Path(__file__).resolve().parent.parent
BUILD_MODEL = ROOT / "examples" / "vllm-cpu" / "build_model.py"
INSTALL_TIMEOUT_S = 1800
RUN_TIMEOUT_S = 1800


@dataclass(frozen=True)
class Peer:
    """A peer client: its package pin and how to drive it and read its TTFT p99 (s) and failed requests."""

    name: str
    version: str
    command: Callable[[Path, str, int, int, Path, Path], list[str]]
    """(venv, server base URL without /v1, concurrency, requests, tokenizer dir, output dir) -> argv."""
    result: Callable[[Path, int], tuple[float, int]]
    """(output dir, requests sent) -> (TTFT p99 in seconds, requests that did not finish)."""


@dataclass
class Measure:
    """One client's run at one level."""

    streams: int
    chunks: int
    cpu_s: float
    ttft_p99_s: float
    failed: int
    extra: str = ""


def _guidellm_command(venv: Path, url: str, concurrency: int, requests: int, tokenizer: Path, out: Path) -> list[str]:
    return [str(venv / "bin" / "guidellm"), "run",
            "--backend", f"kind=openai_http,target={url},model=bench",
            "--profile", f"kind=concurrent,streams={concurrency}",
            "--constraint", f"kind=max_requests,count={requests}",
            "--tokenizer", f"kind=huggingface_auto,model={tokenizer}",
            "--data", "kind=synthetic_text,prompt_tokens=64,output_tokens=128",
            "--output", f"kind=json,path={out / 'benchmarks.json'}",
            "--disable-console"]


def _guidellm_result(out: Path, requests: int) -> tuple[float, int]:
    metrics = json.loads((out / "benchmarks.json").read_text())["benchmarks"][0]["metrics"]
    return (metrics["time_to_first_token_ms"]["successful"]["percentiles"]["p99"] / 1e3,
            requests - int(metrics["request_totals"]["successful"]))


def _aiperf_command(venv: Path, url: str, concurrency: int, requests: int, tokenizer: Path, out: Path) -> list[str]:
    return [str(venv / "bin" / "aiperf"), "profile", "-m", "bench", "--url", url, "--endpoint-type", "chat",
            "--streaming", "--concurrency", str(concurrency), "--request-count", str(requests),
            "--tokenizer", str(tokenizer), "--prompt-input-tokens-mean", "64", "--prompt-output-tokens-mean", "128",
            "--output-artifact-dir", str(out), "--no-server-metrics", "--no-gpu-telemetry", "--no-auto-plot",
            "--ui-type", "none"]


def _aiperf_result(out: Path, requests: int) -> tuple[float, int]:
    data = json.loads((out / "profile_export_aiperf.json").read_text())
    return data["time_to_first_token"]["p99"] / 1e3, requests - int(data["completed_request_count"]["avg"])


PEERS = {
    "guidellm": Peer("guidellm", "0.8.1", _guidellm_command, _guidellm_result),
    "aiperf": Peer("aiperf", "0.13.0", _aiperf_command, _aiperf_result),
}


def cache_root() -> Path:
    return Path(os.environ.get("REPRO_PEERS_CACHE") or Path.home() / ".cache" / "repro-peers")


def _run_quiet(argv: Sequence[str], env: dict[str, str] | None = None) -> str | None:
    """Run an install step; None when it worked, else the last line of what it said."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode == 0:
        return None
    said = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
    return f"exit {done.returncode}: {said[-1] if said else '(no output)'}"


def _uv() -> Path | str:
    """uv, in its own cached venv (installed by pip once); or why it could not be."""
    venv = cache_root() / "uv"
    uv = venv / "bin" / "uv"
    if uv.is_file():
        return uv
    shutil.rmtree(venv, ignore_errors=True)
    error = _run_quiet([sys.executable, "-m", "venv", str(venv)]) or _run_quiet([str(venv / "bin" / "pip"), "install", "-q", "uv"])
    return error if error else uv


def install(peer: Peer) -> Path | str:
    """The peer's cached venv (installed now if absent, timed); or one line saying why there is none."""
    venv = cache_root() / f"{peer.name}-{peer.version}"
    marker = venv / ".repro-complete"
    if marker.is_file():
        print(f"{peer.name} {peer.version}: cached in {venv}")
        return venv
    start = time.perf_counter()
    uv = _uv()
    if isinstance(uv, str):
        return f"uv could not be installed ({uv})"
    shutil.rmtree(venv, ignore_errors=True)
    env = {**os.environ, "VIRTUAL_ENV": str(venv)}
    error = (_run_quiet([str(uv), "venv", "-q", "-p", sys.executable, str(venv)])
             or _run_quiet([str(uv), "pip", "install", "-q", f"{peer.name}=={peer.version}"], env=env))
    if error:
        return f"install failed ({error})"
    marker.write_text(f"{peer.name}=={peer.version}\n")  # last: a broken install is redone next time
    print(f"{peer.name} {peer.version}: installed in {time.perf_counter() - start:.0f} s into {venv}")
    return venv


def tokenizer(venv: Path) -> Path | str:
    """The tiny DeepSeek-style tokenizer (examples/vllm-cpu/build_model.py), built by the peer's own python once."""
    sys.path.insert(0, str(BUILD_MODEL.parent))
    try:
        from build_model import VERSION
    finally:
        sys.path.pop(0)
    out = cache_root() / f"tokenizer-{VERSION}"
    if (out / "tokenizer.json").is_file():
        return out
    code = ("import sys, pathlib; sys.path.insert(0, sys.argv[1]); import build_model; "
            "build_model.build_tokenizer(pathlib.Path(sys.argv[2]))")
    error = _run_quiet([str(venv / "bin" / "python"), "-c", code, str(BUILD_MODEL.parent), str(out)])
    return f"tokenizer could not be built ({error})" if error else out


def server_chunks(url: str) -> int:
    """Content chunks the benchmark server has sent so far."""
    with urllib.request.urlopen(f"{url.removesuffix('/v1')}/stats", timeout=30) as answer:
        return int(json.loads(answer.read())["chunks"])


def run_client(argv: Sequence[str], log: Path) -> tuple[int, float]:
    """Run a client in its own process group; its exit status and CPU seconds (its own and its reaped children's)."""
    ended = run_child(argv, log=log, timeout_s=RUN_TIMEOUT_S, own_group=True)
    return ended.code, ended.cpu_s


def _last_line(log: Path) -> str:
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][:200] if lines else "(no output)"


def measure(name: str, streams: int, args: argparse.Namespace, work: Path,
            peer: tuple[Peer, Path, Path] | None) -> Measure | str:
    """One client at `streams` streams at once, against a fresh server; or why it failed."""
    proc, url = start_server(args.chunks, args.interval, final_after=args.turns, ttft=args.ttft)
    out = work / f"{name}-{streams}"
    out.mkdir(parents=True, exist_ok=True)
    try:
        before = server_chunks(url)
        if peer is None:
            argv = [str(Path(sys.executable).parent / "repro"), "run", "--base-url", url, "--model", "bench",
                    "--sessions", str(streams), "--turns", str(args.turns), "--no-report", "--observe", "parsed",
                    "--timeout", "1200", "--turn-timeout", "600", "--stall-timeout", "300", "--out", str(out / "run")]
        else:
            spec, venv, tok = peer
            argv = spec.command(venv, url.removesuffix("/v1"), streams, streams * args.turns, tok, out)
        code, cpu = run_client(argv, out / "client.log")
        chunks = server_chunks(url) - before
    finally:
        proc.stop()
    if code != 0:
        return f"exit {code}: {_last_line(out / 'client.log')}"
    try:
        if peer is None:
            run = load_run(out / "run")
            assert run.summary is not None
            lag = run.summary.loop_lag.p99 if run.summary.loop_lag else None
            ttft = run.summary.latency["ttft_s"].p99 or float("nan")
            failed = sum(s.outcome != "clean" for s in run.sessions) + streams - len(run.sessions)
            extra = f"; its own loop lag p99 {1e3 * lag:.1f} ms" if lag is not None else ""
            return Measure(streams, chunks, cpu, ttft, failed, extra)
        ttft, failed = peer[0].result(out, streams * args.turns)
        return Measure(streams, chunks, cpu, ttft, failed)
    except (OSError, KeyError, ValueError, IndexError, TypeError, AssertionError) as exc:
        return f"its results could not be read ({type(exc).__name__}: {exc})"


def holds(m: Measure, args: argparse.Namespace) -> bool:
    return m.failed == 0 and m.ttft_p99_s - args.ttft < LAG_LIMIT_S


@dataclass
class Client:
    """A client's figures over the run: its start-up run, its levels, and why it stopped (if it failed)."""

    label: str
    base: Measure | None = None
    levels: dict[int, Measure] | None = None
    held: int = 0
    error: str | None = None

    def per_chunk(self, level: int) -> float | None:
        """CPU per chunk at `level` past start-up: the one-stream run's CPU and chunks taken off."""
        m = (self.levels or {}).get(level)
        if m is None or self.base is None or m.chunks <= self.base.chunks:
            return None
        return (m.cpu_s - self.base.cpu_s) / (m.chunks - self.base.chunks)


def sweep(client: Client, name: str, args: argparse.Namespace, work: Path,
          peer: tuple[Peer, Path, Path] | None) -> None:
    base = measure(f"{name}-startup", 1, args, work, peer)
    if isinstance(base, str):
        client.error = base
        print(f"{client.label}: did not run: {base}")
        return
    client.base, client.levels = base, {}
    print(f"{client.label}: one stream: {base.cpu_s:.2f} s CPU for {base.chunks} chunks (start-up, and running)")
    for level in args.level_list:
        m = measure(name, level, args, work, peer)
        if isinstance(m, str):
            print(f"{client.label} at {level} streams: failed: {m}")
            break
        client.levels[level] = m
        ok = holds(m, args)
        client.held = level if ok else client.held
        per_chunk = client.per_chunk(level)
        marginal = f" ({1e6 * per_chunk:.1f} us per chunk past start-up)" if per_chunk is not None else ""
        print(f"{client.label} at {level:5d} streams: {m.chunks} chunks, {m.cpu_s:.2f} s CPU{marginal}"
              f", TTFT p99 {1e3 * m.ttft_p99_s:.0f} ms (+{1e3 * (m.ttft_p99_s - args.ttft):.0f}), {m.failed} failed"
              f"{m.extra} -> {'ok' if ok else 'over'}; load average {os.getloadavg()[0]:.2f}")
        if not ok:
            break


def _ratio(value: float | None, reference: float | None) -> str:
    if value is None or reference is None or reference <= 0:
        return ""
    return f" ({value / reference:.1f}x)"


def table(clients: list[Client], args: argparse.Namespace) -> None:
    """The summary: each client's figures, a peer's as ratios to repro's."""
    ran = [c for c in clients if c.levels]
    common = [level for level in args.level_list if all(level in (c.levels or {}) for c in ran)]
    level = common[-1] if common else None
    repro = clients[0]
    header = "| | " + " | ".join(c.label for c in clients) + " |"
    print(f"\nratios to repro; CPU and overhead at {level} streams (the largest level every client ran); "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print(header)
    print("|---" * (len(clients) + 1) + "|")

    def row(label: str, value: Callable[[Client], float | None], show: Callable[[float], str]) -> None:
        cells = []
        reference = value(repro) if not repro.error else None
        for c in clients:
            v = value(c) if not c.error else None
            cells.append("n/a" if v is None else show(v) + ("" if c is repro else _ratio(v, reference)))
        print(f"| {label} | " + " | ".join(cells) + " |")

    row("client CPU per chunk past start-up", lambda c: c.per_chunk(level) if level else None,
        lambda v: f"{1e6 * v:.1f} us")
    row("client CPU per chunk, start-up included",
        lambda c: c.levels[level].cpu_s / max(1, c.levels[level].chunks) if level and c.levels else None,
        lambda v: f"{1e6 * v:.1f} us")
    row("timing overhead p99 (TTFT over the server's)",
        lambda c: (c.levels[level].ttft_p99_s - args.ttft) if level and c.levels else None,
        lambda v: f"{1e3 * v:.0f} ms")
    row(f"most paced streams held (overhead < {1e3 * LAG_LIMIT_S:.0f} ms, all finished)",
        lambda c: float(c.held) if c.levels is not None else None, lambda v: f"{v:.0f}")
    for c in clients:
        if c.error:
            print(f"{c.label}: {c.error}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="100,200,400,800", help="Streams at once, climbed until one does not hold.")
    parser.add_argument("--turns", type=int, default=2, help="Turns per repro session; a peer sends streams x turns requests.")
    parser.add_argument("--ttft", type=float, default=2.0, help="Seconds to the first chunk (prefill).")
    parser.add_argument("--chunks", type=int, default=32)
    parser.add_argument("--interval", type=float, default=0.25, help="Seconds between chunks.")
    parser.add_argument("--peers", default="guidellm,aiperf",
                        help="Peers to install and drive (comma-separated), or `none` for repro alone.")
    parser.add_argument("--work", type=Path, help="Keep each client's output here (default: a temporary directory).")
    args = parser.parse_args()
    try:
        args.level_list = [int(x) for x in args.levels.split(",")]
    except ValueError:
        parser.error(f"--levels: not a list of integers: {args.levels!r}")
    names = [] if args.peers == "none" else [n.strip() for n in args.peers.split(",") if n.strip()]
    unknown = [n for n in names if n not in PEERS]
    if unknown:
        parser.error(f"--peers: unknown peer {unknown[0]!r} (known: {', '.join(PEERS)}, or none)")
    ensure_open_files(max(args.level_list))
    print(f"{len(args.level_list)} levels {args.levels}; first chunk at {args.ttft:g} s, then {args.chunks} chunks "
          f"{args.interval:g} s apart; {args.turns} turns a repro session, streams x {args.turns} requests a peer; "
          f"load average {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory(prefix="repro-peers-") as scratch:
        work = args.work or Path(scratch)
        clients = [Client("repro")]
        sweep(clients[0], "repro", args, work, None)
        for name in names:
            spec = PEERS[name]
            client = Client(f"{spec.name} {spec.version}")
            clients.append(client)
            venv = install(spec)
            tok = tokenizer(venv) if isinstance(venv, Path) else venv
            if isinstance(tok, str):
                client.error = tok
                print(f"{client.label}: not run: {tok}")
                continue
            assert isinstance(venv, Path)
            sweep(client, name, args, work, (spec, venv, tok))
    table(clients, args)


if __name__ == "__main__":
    main()
