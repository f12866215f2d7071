# Semantic FPN schedule (PVT's recipe): 40k iterations, AdamW (lr 1e-4, wd 1e-3 as in the UperNet
# schedule), poly decay with power 0.9 and no warm-up; validation and checkpoints every 4k.
_base_ = ['./seg_adamw_160k.py']

train_cfg = dict(max_iters=40000, val_interval=4000)
param_scheduler = [dict(type='PolyLR', eta_min=0., power=0.9, by_epoch=False, begin=0, end=40000)]
default_hooks = dict(checkpoint=dict(interval=4000))
