from .layers import NaLaAttention, NaLaBlock, NaLaStage, inplace_inference
from .nalaformer import MODEL_ARGS, NaLaFormer, checkpoint_filter_fn
from . import nala_sr, nala_swin
