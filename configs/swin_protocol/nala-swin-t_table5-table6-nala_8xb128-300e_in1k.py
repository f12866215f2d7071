# The paper's Swin-T protocol (v1 Tables 5 and 6), full NaLa: Swin-T with norm-aware linear attention
# (the released kernel) applied globally in stages 1-2, shifted-window softmax in stages 3-4.
# Table 5 row 3 ("+ norm-aware power") and Table 6 row "NaLa": 82.9 top-1, 29M / 4.8G reported.
# Swin's recipe on 8 GPUs x 128 images: 300 epochs, AdamW 1e-3, wd 0.05, 20 warm-up epochs, cosine,
# RandAugment, random erasing 0.25 and the base model file's drop path, Mixup/CutMix and label smoothing;
# unlike the NaLaFormer recipe no repeated augmentation and no EMA (Swin uses neither).
_base_ = [
    '../_base_/models/nala_swin_t.py',
    '../_base_/datasets/imagenet_bs128.py',
    '../_base_/schedules/swin_imagenet_bs1024_adamw_300e.py',
    '../_base_/default_runtime.py',
]
model = dict(arch='nala_swin_tiny', attn_types=('nala', 'nala', 'shifted_window', 'shifted_window'))
train_dataloader = dict(sampler=dict(_delete_=True, type='DefaultSampler', shuffle=True))
custom_hooks = [
    dict(type='EpochSeedHook'),            # exact resume from epoch-end checkpoints
    dict(type='ResumableCheckpointHook'),  # checkpoints load with torch.load(weights_only=True)
]
default_hooks = dict(checkpoint=dict(save_best='accuracy/top1'))  # no EMA, so no ema/ metrics
