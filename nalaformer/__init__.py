"""NaLaFormer: norm-aware linear attention. Importing this package registers the timm models."""
from . import models, ops
from .models import NaLaAttention, NaLaFormer

__version__ = '0.1.0'
