# The UperNet schedule over 80k iterations (Cityscapes; the paper gives no Cityscapes protocol, 80k at
# 8 x 2 images of 512x1024 is mmseg's usual one); validation and checkpoints every 8k.
_base_ = ['./seg_adamw_160k.py']

train_cfg = dict(max_iters=80000, val_interval=8000)
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', eta_min=0., power=1.0, by_epoch=False, begin=1500, end=80000),
]
default_hooks = dict(checkpoint=dict(interval=8000))
