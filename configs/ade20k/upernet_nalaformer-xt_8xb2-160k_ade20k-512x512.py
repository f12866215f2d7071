# NaLaFormer-XT + UperNet on ADE20K (the T recipe with this variant's widths and drop path).
_base_ = ['./upernet_nalaformer-t_8xb2-160k_ade20k-512x512.py']
model = dict(
    backbone=dict(
        arch='nalaformer_xt',
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/nalaformer_xt_in1k.pth')),
    decode_head=dict(in_channels=[32, 64, 128, 384]),
    auxiliary_head=dict(in_channels=128))
