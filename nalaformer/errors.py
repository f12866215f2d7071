"""The project's user-facing errors and the one way every tool reports them.

A :class:`UserError` says that what the user asked for is wrong (a path, a config key or value, a
dataset, a checkpoint, a destination) and how to fix it. Tools print it as one line ``error: ...`` and
exit with :data:`USER_ERROR_EXIT` (2, as argparse does for a bad command line); anything else is a bug
and keeps its traceback (exit code 1).
"""
import sys
from typing import Callable, Optional, Sequence

__all__ = ['UserError', 'ConfigError', 'DatasetError', 'DestinationError', 'USER_ERROR_EXIT', 'report', 'run_tool']

USER_ERROR_EXIT = 2


class UserError(Exception):
    """A mistake in the command line, config, data or files given: the message says what and how to fix it."""


class ConfigError(UserError, ValueError):
    """A bad argument, config key or value, or data path."""


class DatasetError(ConfigError):
    """A dataset folder that would train or evaluate on something else than the user thinks."""


class DestinationError(UserError, ValueError):
    """An output path that cannot be written, or whose writing would destroy files the tool did not create."""


def report(error: UserError) -> int:
    """Print ``error: <message>`` on stderr; the exit code of a user error."""
    print(f'error: {error}', file=sys.stderr)
    return USER_ERROR_EXIT


def run_tool(main: Callable[[Optional[Sequence[str]]], object], argv: Optional[Sequence[str]] = None) -> int:
    """Run a tool's ``main(argv)``: 0 (or the int it returns) when it completes, :func:`report`'s code when
    it raises a :class:`UserError`; other exceptions propagate with their traceback."""
    try:
        result = main(argv)
    except UserError as e:
        return report(e)
    return result if isinstance(result, int) else 0
