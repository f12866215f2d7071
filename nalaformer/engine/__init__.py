"""The runner core every task shares (mmengine's Runner with checks, resumable loops, hooks, work dirs); importing
registers it. It names no task: classification, super-resolution and dense prediction are plug-ins
(:mod:`nalaformer.classification`, :mod:`nalaformer.sr`, :mod:`nalaformer.dense`) that a config imports
(``custom_imports``) and that answer the core through :mod:`nalaformer.engine.model_spec` (which part of a config
is the timm model) and :mod:`nalaformer.engine.datasets` (data checks, dry-run data).
"""
from .checkpoint import NaLaRunner, ResumableCheckpointHook
from .containment import ContainedCheckpointHook
from .guard import DivergenceError, NonFiniteGuardHook
from .hooks import DualEMAHook, EpochSeedHook, UnreadableImageHook
from .loops import ResumableEpochBasedTrainLoop, ResumableIterBasedTrainLoop
from .optim import CPUAmpOptimWrapper
from .preemption import Preempted, PreemptionHook
