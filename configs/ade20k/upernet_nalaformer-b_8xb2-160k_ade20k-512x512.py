# NaLaFormer-B + UperNet on ADE20K (the T recipe with this variant's widths and drop path).
_base_ = ['./upernet_nalaformer-t_8xb2-160k_ade20k-512x512.py']
model = dict(
    backbone=dict(
        arch='nalaformer_b',
        drop_path_rate=0.4,
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/nalaformer_b_in1k.pth')),
    decode_head=dict(in_channels=[96, 192, 384, 512]),
    auxiliary_head=dict(in_channels=384))
