"""The `repro` command line: thin typer wrappers that parse options and call into the modules that do the work."""

from __future__ import annotations

import sys

import typer

from repro import __version__
from repro.errors import EXIT_INTERRUPTED, ReproError

app = typer.Typer(
    name="repro",
    help="Reproduce concurrency-dependent tool-call corruption in LLM serving deployments and bisect it to its cause.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
sim_app = typer.Typer(help="The embedded DeepSeek-V4 SGLang simulator.", no_args_is_help=True)
app.add_typer(sim_app, name="sim")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"repro {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    pass


def main() -> None:
    """Console entry point: ReproError becomes one line on stderr and its exit code, never a traceback."""
    try:
        app()
    except ReproError as err:
        typer.echo(f"repro: error: {err}", err=True)
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        typer.echo("repro: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
