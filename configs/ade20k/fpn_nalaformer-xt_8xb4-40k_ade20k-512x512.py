# NaLaFormer-XT + Semantic FPN on ADE20K (the T recipe with this variant's widths and drop path).
_base_ = ['./fpn_nalaformer-t_8xb4-40k_ade20k-512x512.py']
model = dict(
    backbone=dict(
        arch='nalaformer_xt',
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/nalaformer_xt_in1k.pth')),
    neck=dict(in_channels=[32, 64, 128, 384]))
