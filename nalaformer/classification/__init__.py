"""Classification plug-in: timm classifiers (any timm model) trained with timm's data pipeline on ImageFolder
data; importing registers the wrapper, dataset, sampler and metric, and the dataset's checks.

Configs load it with ``custom_imports=dict(imports=['nalaformer.classification'], allow_failed_imports=False)``.
"""
from . import support  # noqa: F401  (registers the ImageFolder checks and dry-run data)
from .data import ImageFolderDataset, RepeatAugSampler
from .metrics import Accuracy
from .model import TimmClassifier
