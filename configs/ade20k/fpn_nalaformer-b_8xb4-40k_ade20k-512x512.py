# NaLaFormer-B + Semantic FPN on ADE20K (the T recipe with this variant's widths and drop path).
_base_ = ['./fpn_nalaformer-t_8xb4-40k_ade20k-512x512.py']
model = dict(
    backbone=dict(
        arch='nalaformer_b',
        drop_path_rate=0.4,
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/nalaformer_b_in1k.pth')),
    neck=dict(in_channels=[96, 192, 384, 512]))
