# Ten epochs of AdamW for pico models trained from scratch on one CPU (batch 64): one warm-up epoch,
# cosine decay, no weight decay on norms and biases (experiments add their own no-decay keys).
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=3e-3, weight_decay=0.05),
    paramwise_cfg=dict(norm_decay_mult=0.0, bias_decay_mult=0.0))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.1, by_epoch=True, begin=0, end=1, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=1, end=10, convert_to_iter_based=True),
]
train_cfg = dict(by_epoch=True, max_epochs=10, val_interval=1)
val_cfg = dict()
test_cfg = dict()
auto_scale_lr = dict(base_batch_size=64, enable=False)  # tools/train.py --auto-scale-lr: lr x total batch / 64
