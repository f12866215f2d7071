"""Checkpoints: safe reading and weight choice (:mod:`.reading`), model definitions (:mod:`.definitions`),
atomic writing (:mod:`.writing`), loading into models (:mod:`.loading`), conversion and timm folders
(:mod:`.conversion`, imported on its own: it builds models). Every error is a typed :mod:`.errors` class.

Every tool that takes a checkpoint reads it once through :class:`Checkpoint`. Module boundaries and the
load path: docs/checkpoints.md.
"""
from .definitions import (
    check_definition, definition_modules, describe_definition, model_definition, model_definitions,
)
from .errors import (
    CheckpointError, CorruptCheckpointError, DefinitionMismatchError, MissingCheckpointError, NotACheckpointError,
    NotResumableError,
)
from .loading import (
    LoadReport, check_checkpoint_file, check_recorded_definitions, check_shapes, check_starting_weights,
    check_state_dict_fits, config_key_error, load_checkpoint_into, load_starting_weights, loading_options,
    pretrained_kwargs, pretrained_options, pretrained_weights, shape_mismatches,
)
from .reading import (
    EMA_KEYS, ORIGIN_KEY, TIMM_FOLDER_WEIGHTS, WEIGHT_KEYS, Checkpoint, is_converted_file, is_timm_folder,
    newest_readable_checkpoint, read_checkpoint, strip_wrapper_prefixes,
)
from .writing import save_state_dict
