# Semantic FPN schedule as in PoolFormer's and VAN's ADE20K configs (sail-sg/poolformer
# segmentation/configs/sem_fpn/PoolFormer/fpn_poolformer_s12_ade20k_40k.py, Visual-Attention-Network/
# VAN-Segmentation configs/sem_fpn/VAN/fpn_van_base_ade20k_40k.py): 40k iterations at 8 GPUs x 4 images with
# lr 2e-4, poly decay (power 0.9) to 0 and no warm-up; PVT's original FPN recipe at twice its batch (16) and
# lr (1e-4) for half its 80k iterations. Weight decay 1e-3 as the paper states (those configs: 1e-4),
# AdamW and the decay rule as in the UperNet schedule. Validation and checkpoints every 4k iterations.
_base_ = ['./seg_adamw_160k.py']

optim_wrapper = dict(optimizer=dict(lr=2e-4))
train_cfg = dict(max_iters=40000, val_interval=4000)
param_scheduler = [dict(type='PolyLR', eta_min=0., power=0.9, by_epoch=False, begin=0, end=40000)]
default_hooks = dict(checkpoint=dict(interval=4000))
auto_scale_lr = dict(base_batch_size=32)  # --auto-scale-lr: lr 2e-4 x total batch / 32
