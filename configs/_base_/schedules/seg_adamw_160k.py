# UperNet schedule: 160k iterations, AdamW at the paper's lr 1e-4 / weight decay 1e-3 (Swin's
# UperNet recipe uses lr 6e-5 / wd 0.01 with the same warm-up and schedule), 1500 linear warm-up
# iterations, then linear (poly power 1) decay to 0. Validation and checkpoints every 16k iterations.
_base_ = ['mmseg::_base_/schedules/schedule_160k.py']

optimizer = dict(_delete_=True, type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=1e-3)
optim_wrapper = dict(
    optimizer=optimizer,
    # no decay on norms, biases and LayerScale (as in ImageNet training)
    paramwise_cfg=dict(norm_decay_mult=0., bias_decay_mult=0., custom_keys={'gamma_': dict(decay_mult=0.)}))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', eta_min=0., power=1.0, by_epoch=False, begin=1500, end=160000),
]
default_hooks = dict(checkpoint=dict(max_keep_ckpts=3, save_best='mIoU', rule='greater'))
