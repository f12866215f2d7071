"""Super-resolution plug-in: timm SR networks trained with an L1 loss on paired HR/LR images, evaluated by PSNR /
SSIM per benchmark set; importing registers the wrapper, datasets and metric, and the datasets' checks.

Configs load it with ``custom_imports=dict(imports=['nalaformer.sr'], allow_failed_imports=False)``.
"""
from . import support  # noqa: F401  (registers the SR dataset checks and dry-run data)
from .data import SRBenchmarkDataset, SRPairedDataset
from .metrics import SRMetric
from .model import SRModel
