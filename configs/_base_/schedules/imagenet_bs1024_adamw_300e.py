# Release recipe (the authors' training script): AdamW lr 5e-4 x batch/512 (1e-3 at 1024), wd 0.05 without decay on
# norms, biases and LayerScale; 5 warm-up epochs from 1e-6, cosine to 1e-5, 300 epochs.
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05, betas=(0.9, 0.999), eps=1e-8),
    paramwise_cfg=dict(
        norm_decay_mult=0.0, bias_decay_mult=0.0,
        custom_keys={'gamma_1': dict(decay_mult=0.0), 'gamma_2': dict(decay_mult=0.0)}),
    clip_grad=None,  # e.g. dict(max_norm=5.0)
    accumulative_counts=1,
)
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, begin=0, end=5, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=5, end=300, convert_to_iter_based=True),
]
train_cfg = dict(by_epoch=True, max_epochs=300, val_interval=1)
val_cfg = dict()
test_cfg = dict()
auto_scale_lr = dict(base_batch_size=1024, enable=False)
