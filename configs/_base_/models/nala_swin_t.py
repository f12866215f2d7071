# NaLa-Swin-T classifier, the paper's Swin-T protocol (v1 Tables 5-6): Swin-T whose stages 1-2 use the
# linear attention under study globally (+ 5x5 depthwise conv on v), stages 3-4 Swin's shifted windows.
# Regularisation of Swin's ImageNet recipe: drop path 0.2, Mixup 0.8 / CutMix 1.0, label smoothing 0.1.
model = dict(
    type='TimmClassifier',
    arch='nala_swin_tiny',
    num_classes=1000,
    drop_path_rate=0.2,
    # Per stage: a kernel of nalaformer.ops.kernels run globally, or 'shifted_window' (Swin's windowed softmax).
    # kernel_kwargs: None, or one dict per stage (None for shifted-window stages), e.g. (dict(power=3.0),
    # dict(power=3.0), None, None) with attn_types=('relu', 'relu', 'shifted_window', 'shifted_window').
    attn_types=('nala', 'nala', 'shifted_window', 'shifted_window'),
    kernel_kwargs=None,
    dwc_kernel_size=5,
    mixup=dict(mixup_alpha=0.8, cutmix_alpha=1.0, prob=1.0, switch_prob=0.5, mode='batch'),
    label_smoothing=0.1,
    grad_checkpointing=False,
)
