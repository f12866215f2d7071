# NaLaFormer-S + UperNet on Cityscapes (the T recipe with this variant's widths and drop path).
_base_ = ['./upernet_nalaformer-t_8xb2-80k_cityscapes-512x1024.py']
model = dict(
    backbone=dict(
        arch='nalaformer_s',
        drop_path_rate=0.15,
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/nalaformer_s_in1k.pth')),
    decode_head=dict(in_channels=[64, 128, 320, 512]),
    auxiliary_head=dict(in_channels=320))
