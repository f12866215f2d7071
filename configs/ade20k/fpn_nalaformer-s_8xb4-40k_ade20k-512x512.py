# NaLaFormer-S + Semantic FPN on ADE20K (the T recipe with this variant's widths and drop path).
# Paper (v1): 48.0 mIoU.
_base_ = ['./fpn_nalaformer-t_8xb4-40k_ade20k-512x512.py']
model = dict(
    backbone=dict(
        arch='nalaformer_s',
        drop_path_rate=0.15,
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/nalaformer_s_in1k.pth')),
    neck=dict(in_channels=[64, 128, 320, 512]))
