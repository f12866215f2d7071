# UperNet schedule: 160k iterations at 8 GPUs x 2 images, AdamW at the paper's lr 1e-4 / weight decay 1e-3
# (v1, segmentation setup; Swin's UperNet recipe, whose schedule this is, uses lr 6e-5 / wd 0.01), 1500 linear
# warm-up iterations from 1e-6 x lr, then linear (poly power 1) decay to 0 (Swin's UperNet configs).
# Validation and checkpoints every 16k iterations.
_base_ = ['mmseg::_base_/schedules/schedule_160k.py']

optimizer = dict(_delete_=True, type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=1e-3)
optim_wrapper = dict(
    optimizer=optimizer,
    # The release's decay rule (timm's create_optimizer, as on ImageNet): none for ndim <= 1 (norms) and
    # biases; LayerScale gamma_1/gamma_2, shape (1, C, 1, 1), decay. No dense-task code is released.
    paramwise_cfg=dict(bias_decay_mult=0., flat_decay_mult=0.))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', eta_min=0., power=1.0, by_epoch=False, begin=1500, end=160000),
]
default_hooks = dict(checkpoint=dict(max_keep_ckpts=3, save_best='mIoU', rule='greater'))
# tools/train.py --auto-scale-lr: lr x total batch / 16 (the linear rule; the configs' batch is 8 x 2)
auto_scale_lr = dict(base_batch_size=16, enable=False)
