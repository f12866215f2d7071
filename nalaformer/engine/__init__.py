"""What mmengine needs for classification and super-resolution with timm models; importing registers it all.

Everything else (Runner, optimizers, schedulers, EMA, logging, checkpoint hooks) is
mmengine's own; data augmentation, Mixup/CutMix and losses are timm's.
"""
from .checkpoint import NaLaRunner, ResumableCheckpointHook
from .classifier import TimmClassifier
from .containment import ContainedCheckpointHook
from .data import ImageFolderDataset, RepeatAugSampler, UnreadableImageHook
from .guard import DivergenceError, NonFiniteGuardHook
from .loops import ResumableEpochBasedTrainLoop, ResumableIterBasedTrainLoop
from .preemption import Preempted, PreemptionHook
from .hooks import DualEMAHook, EpochSeedHook
from .metrics import Accuracy
from .optim import CPUAmpOptimWrapper
from .sr_data import SRBenchmarkDataset, SRPairedDataset
from .sr_metrics import SRMetric
from .sr_model import SRModel
