"""The `opprof` command line: one click group, one module per command in opprof/commands/."""

from __future__ import annotations

import importlib
import shlex
import sys

import click

from opprof.errors import Interrupted, OpprofError, raise_on_signals
from opprof.invocation import set_invocation
from opprof.version import __version__

#: Command name → the module under opprof.commands defining it. A command's module (and
#: what it needs: pandas, the frameworks for ``record``) is imported only when that command
#: runs, so ``opprof report`` never imports torch, TensorFlow or MXNet.
COMMANDS = {"record": "record", "run": "run", "import": "import_", "report": "report",
            "diff": "diff", "export": "export", "bench": "bench", "model": "model",
            "whatif": "whatif", "calibrate": "calibrate", "plot": "plot", "advise": "advise"}


class LazyGroup(click.Group):
    """A click group that imports a command's module when the command is looked up."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = COMMANDS.get(cmd_name)
        if module is None:
            return None
        command: click.Command = importlib.import_module(f"opprof.commands.{module}").command
        return command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="opprof")
def cli() -> None:
    """Operator-level profiler and trace analyzer for distributed deep-learning training.

    \b
    opprof record --fw mxnet --model resnet18     train under the native profiler, report
    opprof run -- python train.py                 profile your own training command
    opprof report run.trace --by op --top 15      per-operator table
    opprof diff tf.trace mxnet.trace              what explains the step-time gap
    opprof model run.trace --workers 1,2,4,8      predicted step time and speed-up
    opprof whatif run.trace --op batch_norm=0.5   the step with an operator changed
    opprof advise run.trace                       what to change, ranked by time saved
    opprof diff base.trace new.trace --fail-above 5%   a regression gate for CI
    opprof report run.trace --format html -o run.html   charts in one offline file
    opprof plot bench/ --figure phases -o phases.pdf    a paper figure (svg/png/pdf)
    """



def main() -> None:
    """Entry point: run the CLI; an OpprofError is one line on stderr and exit code 2; a run
    stopped by a signal is one line and 128 + the signal's number."""
    raise_on_signals()
    set_invocation(shlex.join(["opprof", *sys.argv[1:]]))  # the .trace files' stamp
    _main()
    if sys.argv[1:2] == ["report"]:
        _exit_at_once()


def _exit_at_once() -> None:
    """End a finished report without freeing its objects one by one: the exit handlers run
    and the output is flushed, then the process ends and the system takes its memory back
    at once (Python's own teardown of pandas' and numpy's objects costs ~0.1 s). Left to
    Python's exit when a thread that is not a daemon still runs or the output cannot be
    flushed (Python then says so as usual)."""
    import atexit
    import os
    import threading

    if any(t.is_alive() and not t.daemon for t in threading.enumerate()
           if t is not threading.main_thread()):
        return
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:
        os._exit(0)  # as _main: a reader that stopped reading (| head) is no error
    except OSError:
        return
    os._exit(0)


def _say(text: str) -> None:
    """One line on stderr, whatever the message holds (a newline in a file name)."""
    from opprof.files import shown

    click.echo(shown(text), err=True)


def _main() -> None:
    try:
        cli.main(standalone_mode=False)
    except BrokenPipeError:
        sys.exit(0)
    except Interrupted as exc:
        _say(f"opprof: {exc}")
        sys.exit(exc.exit_code)
    except OpprofError as exc:
        _say(f"opprof: error: {exc}")
        sys.exit(exc.exit_code)
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        _say(f"opprof: error: {where}{exc.strerror or exc}")
        sys.exit(2)
    except click.exceptions.UsageError as exc:  # one line, not click's usage block
        cmd = exc.ctx.command_path if exc.ctx else "opprof"
        _say(f"opprof: error: {exc.format_message()} (see {cmd} --help)")
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("opprof: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("opprof: interrupted", err=True)
        sys.exit(130)
