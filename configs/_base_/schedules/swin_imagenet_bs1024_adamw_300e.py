# Swin Transformer's ImageNet-1K recipe (Liu et al. 2021; microsoft/Swin-Transformer config.py and
# optimizer.py), used by the paper's Swin-T protocol: AdamW lr 5e-4 x batch/512 (1e-3 at 1024), wd 0.05;
# 20 linear warm-up epochs from 5e-7 x batch/512 (1e-6 at 1024), cosine to 5e-6 x batch/512 (1e-5), 300 epochs;
# gradient clipping at norm 5. No decay as Swin's set_weight_decay: parameters with one dimension,
# names ending in .bias and relative_position_bias_table (no_weight_decay_keywords).
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05, betas=(0.9, 0.999), eps=1e-8),
    paramwise_cfg=dict(
        bias_decay_mult=0.0, flat_decay_mult=0.0,
        custom_keys={'relative_position_bias_table': dict(decay_mult=0.0)}),
    clip_grad=dict(max_norm=5.0),
    accumulative_counts=1,
)
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, begin=0, end=20, convert_to_iter_based=True),
    # eta_min as a ratio: Swin scales its minimum lr with the batch, as the peak and the warm-up start
    dict(type='CosineAnnealingLR', eta_min_ratio=1e-2, by_epoch=True, begin=20, end=300, convert_to_iter_based=True),
]
train_cfg = dict(by_epoch=True, max_epochs=300, val_interval=1)
val_cfg = dict()
test_cfg = dict()
auto_scale_lr = dict(base_batch_size=1024, enable=False)  # tools/train.py --auto-scale-lr: Swin's linear rule
