# NaLaFormer-S + UperNet on ADE20K (the T recipe with this variant's widths and drop path).
# Paper (v1): 48.5 mIoU.
_base_ = ['./upernet_nalaformer-t_8xb2-160k_ade20k-512x512.py']
model = dict(
    backbone=dict(
        arch='nalaformer_s',
        drop_path_rate=0.15,
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/nalaformer_s_in1k.pth')),
    decode_head=dict(in_channels=[64, 128, 320, 512]),
    auxiliary_head=dict(in_channels=320))
