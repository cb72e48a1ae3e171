"""The `fleet` group: every family of verbs registered, the config command, `main`, which
maps every error to a documented exit code, and `console_main`, the command's entry point."""

from __future__ import annotations

import atexit
import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import click

from fleet import __version__
from fleet.cli.common import CONTEXT
from fleet.cli.lazy import VERBS, Verbs
from fleet.core.errors import ExitCode, FleetError
from fleet.core.safetext import clean


class _Group(click.Group):
    """The `fleet` group: a verb whose stdout or stderr lost its reader (`fleet hosts | head`)
    ends quietly with READER_LEFT (fleet/output/pipes.py), not click's exit 1."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        # `fleet --help` and `--version` print here, before invoke: click's own handler made
        # their broken pipe exit 1.
        try:
            return super().make_context(info_name, args, parent, **extra)
        except BrokenPipeError:
            _reader_left_exit()

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            _reader_left_exit()


def _reader_left_exit() -> NoReturn:
    """The BrokenPipeError being handled, as READER_LEFT when stdout or stderr lost its reader."""
    from fleet.output import pipes

    if not pipes.silence_broken():
        raise  # noqa: PLE0704  (called only from an except block: re-raises its exception)
    raise SystemExit(int(ExitCode.READER_LEFT)) from None


@click.group(cls=_Group, context_settings=CONTEXT, commands=Verbs(VERBS))
@click.version_option(__version__, prog_name="fleet")
def cli() -> None:
    """Run steps on many GPU training nodes over SSH, in parallel, and see every node's state.

    \b
    Exit codes: 0 all ok · 1 fleet error (inventory, playbook, config) · 2 usage
                3 a step failed on some host · 4 a host unreachable or timed out · 130 interrupted
                141 the reader of the output left (`| head`)
    """


def _error(message: str, hint: str = "") -> None:
    """The error line and its hint. Messages quote values (inventory keys, host names, file
    lines): their control characters show escaped."""
    click.echo(click.style("fleet: error: ", fg="red", bold=True) + clean(message), err=True)
    if hint:
        click.echo(f"  hint: {clean(hint)}", err=True)


def _defaults(args: Sequence[str]) -> dict[str, Any]:
    """Option defaults from the config files (fleet/cli/config.py); help and version never fail on
    a broken file, everything else stops on it with file:line."""
    from fleet.cli import config

    try:
        return config.default_map(config.resolve(), cli)
    except FleetError:
        if {"-h", "--help", "--version"} & set(args) or not args:
            return {}
        raise


@cli.command(name="config", context_settings=CONTEXT)
@click.option("--json", "json_", is_flag=True, help="Print JSON instead of a table.")
def config_(json_: bool) -> None:
    """Show the effective defaults and where each comes from: env > ./fleet.yaml (or a parent's)
    > ~/.config/fleet/config.yaml > built-in. A flag on the command line wins over all of them."""
    from fleet.cli import config

    lines, settings = config.report(dict(os.environ), Path.cwd(), as_json=json_)
    for text in lines:
        click.echo(text)
    error = config.env_error(settings)
    if error is not None:  # shown, flagged, and said: a script checking `fleet config` sees it
        raise error


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Console entry point: one line + hint for every user error, a traceback only with --debug."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args or bool(os.environ.get("FLEET_DEBUG"))
    if debug:
        _debug_notes()
    try:
        cli.main(args=args, prog_name="fleet", standalone_mode=False, default_map=_defaults(args))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        sys.exit(int(ExitCode.READER_LEFT) if _reader_left() else code)
    except click.exceptions.Abort:
        if _reader_left():  # a ReaderLeft outside a run's loop: quietly, as SIGPIPE
            sys.exit(int(ExitCode.READER_LEFT))
        click.echo("\nfleet: aborted", err=True)
        sys.exit(int(ExitCode.INTERRUPTED))
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except FleetError as exc:
        if debug:
            raise
        _error(exc.message, exc.hint)
        sys.exit(int(exc.exit_code))
    except KeyboardInterrupt:
        click.echo("\nfleet: interrupted", err=True)
        sys.exit(int(ExitCode.INTERRUPTED))
    except Exception as exc:
        if debug:
            raise
        _error(
            f"internal error: {type(exc).__name__}: {exc}",
            "this is a bug in fleet; rerun with --debug for the traceback and report it",
        )
        sys.exit(int(ExitCode.FLEET_ERROR))
    sys.exit(0)


def _reader_left() -> bool:
    """Whether the reader of fleet's output left (fleet/output/pipes.py, loaded by then if so:
    not loaded at all for most commands, whose start it would slow)."""
    pipes = sys.modules.get("fleet.output.pipes")
    return pipes is not None and bool(pipes.reader_left())


def _debug_notes() -> None:
    """What `--debug` says before the command: why fleet itself runs slower than it could."""
    from fleet.core import codecache

    note = codecache.refusal()
    if note is not None:
        click.echo(clean(f"fleet: debug: {note}"), err=True)


def console_main() -> NoReturn:
    """The `fleet` command (and `python -m fleet`): main(), then out at once.

    Interpreter shutdown after a run (freeing every module and object, paramiko's transports
    among them) took ~50 ms, an eighth of a whole `exec` on 8 nodes. What of it matters is done
    here: threads that are not daemons finish, the atexit handlers run, stdout and stderr are
    flushed; then the process ends with main's exit code. Every file fleet writes is closed by
    the code that wrote it, not left to the garbage collector. (Tests call main() itself.)
    """
    code: object = None
    if 1 in _open_closed_std_fds():
        _error(
            "stdout is closed: nowhere to write fleet's output",
            "redirect it instead: >/dev/null discards the output",
        )
        code = int(ExitCode.USAGE)
    else:
        try:
            main()
        except SystemExit as exc:
            code = exc.code
    _exit_now(code if isinstance(code, int) else (0 if code is None else 1))


def _open_closed_std_fds() -> set[int]:
    """stdin, stdout or stderr closed when fleet starts (`fleet ... <&-`, `2>&-`): each is given
    /dev/null, so that no file or socket fleet opens later takes its number (a child would read
    or write it as its own stdin, stdout or stderr), and Python's stream for it is made again
    (Python leaves it None). Returns the fds that were closed: a closed stdout is refused."""
    closed = set()
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            closed.add(fd)
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    if 0 in closed:
        sys.stdin = open(0, closefd=False)  # noqa: SIM115  (the process's stdin, never closed)
    if 1 in closed:
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
    if 2 in closed:
        sys.stderr = open(2, "w", errors="backslashreplace", closefd=False)  # noqa: SIM115
    return closed


def _exit_now(code: int) -> NoReturn:
    current = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not current and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):
            pass  # the reader left (`fleet ... | head`) or the stream is closed: nobody to tell
        except OSError:
            code = code or int(ExitCode.FLEET_ERROR)  # output lost (a full disk): not a success
    os._exit(code)
