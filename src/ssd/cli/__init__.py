"""The ``ssd`` command line: ``ssd train|val|predict|export|benchmark|check|demo|import|weights|data``.

One grammar everywhere: ``--option value`` (``--epochs 50``), booleans as ``--amp`` / ``--no-amp``.
``ssd train`` takes every field of :class:`ssd.training.config.TrainConfig` as an option and ``--config FILE.yaml``
for a file of the same fields; options given on the command line win over the file.
An unknown option is answered with the closest valid ones. The project's own errors (:class:`ssd.errors.SSDError`:
data, checkpoints, options, a missing extra) and the system's refusal of a path (``No such file or directory: x``)
are printed as one readable message (exit code 1 for errors, 2 for command-line mistakes); set ``SSD_DEBUG=1`` for
the full traceback. Anything else is a bug: its traceback is shown.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings

from ssd.cli.commands import COMMANDS
from ssd.cli.parsers import build_parser, parse
from ssd.errors import SSDError, UsageError
from ssd.names import printable

__all__ = ["main"]


def _with_library_messages(command, args: argparse.Namespace) -> int:
    """Run ``command`` with what the library reports on the ``ssd`` logger (the format of imported weights, the
    classes carried over when fine-tuning, ...) shown on stderr: part of the command's output; the library's own
    warnings (``ssd.data.images.ImageWarning``, ...) as one ``warning: ...`` line each, once; no progress bars with
    ``--quiet``."""
    from ssd.log import progress_enabled, set_progress

    shown_progress = progress_enabled()
    set_progress(shown_progress and not getattr(args, "quiet", False))
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("ssd")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    shown: set[str] = set()

    def show(message, category, filename, lineno, file=None, line=None):
        if not category.__module__.startswith("ssd."):
            return default_show(message, category, filename, lineno, file, line)
        if str(message) not in shown:
            shown.add(str(message))
            print(f"warning: {message}", file=sys.stderr)

    with warnings.catch_warnings():
        default_show, warnings.showwarning = warnings.showwarning, show
        try:
            return command(args)
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)
            set_progress(shown_progress)



def _one_line(error: Exception) -> str:
    """The message of a library error, or ``strerror: path`` for an OSError raised on a user's path."""
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        target = f" -> {error.filename2}" if error.filename2 is not None else ""
        return printable(f"{error.strerror}: {error.filename}{target}")
    return "\n".join(map(printable, str(error).split("\n")))  # a name in a message never acts on the terminal


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = os.environ.get("SSD_DEBUG") == "1"
    try:
        parser = build_parser()
        args = parse(parser, argv)
        if args.version:
            from ssd._version import __version__

            print(__version__)
            return 0
        if not args.command:
            parser.print_help()
            return 2
        code = _with_library_messages(COMMANDS[args.command], args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handlers below
        return code
    except BrokenPipeError:  # `ssd check D | head -3`: the reader has what it wanted; exit quietly as POSIX tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit-time flush cannot fail again
        return 141
    except UsageError as e:
        if debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (SSDError, OSError) as e:  # the project's own errors (a missing extra too); the system refusing a path
        if debug or not (isinstance(e, SSDError) or (e.filename is not None and e.strerror)):
            raise  # anything else is a bug: its traceback is shown
        print(f"error: {_one_line(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
