# NaLaFormer-T classifier with the release's training regularisation (main.py defaults): Mixup 0.8 / CutMix 1.0,
# switch 0.5, per batch; label smoothing 0.1. Drop path per variant, in each config (release NALA.py).
model = dict(
    type='TimmClassifier',
    arch='nalaformer_t',
    num_classes=1000,
    attn_types=('nala', 'nala', 'softmax', 'softmax'),  # release hybrid; 'nala' for all stages
    mixup=dict(mixup_alpha=0.8, cutmix_alpha=1.0, prob=1.0, switch_prob=0.5, mode='batch'),
    label_smoothing=0.1,
    grad_checkpointing=False,
)
