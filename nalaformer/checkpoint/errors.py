"""The checkpoint package's errors: all user errors (one line, exit code 2), typed so that callers choose
what to say by the kind of error, never by its text."""
from ..errors import UserError

__all__ = ['CheckpointError', 'MissingCheckpointError', 'NotACheckpointError', 'CorruptCheckpointError',
           'NotResumableError', 'DefinitionMismatchError']


class CheckpointError(UserError, ValueError):
    """A checkpoint that cannot be read or does not fit the model; the message says why."""


class MissingCheckpointError(CheckpointError, FileNotFoundError):
    """No file or folder at the checkpoint's path."""


class NotACheckpointError(CheckpointError):
    """The file is no checkpoint at all (text, an image, random bytes, a zip of something else)."""


class CorruptCheckpointError(CheckpointError):
    """The file was a checkpoint but is truncated or damaged (an interrupted copy or write)."""


class NotResumableError(CheckpointError):
    """A checkpoint that holds weights but no training state, given to resume a training run."""


class DefinitionMismatchError(CheckpointError):
    """The checkpoint's model computes another function than the model it is loaded into."""
