# NaLaFormer-S: RetinaNet + FPN, COCO 1x.
# Drop path 0.15 as on ImageNet; everything else as for NaLaFormer-T.
_base_ = ['./retinanet_nalaformer-t_fpn_1x_coco.py']

model = dict(
    backbone=dict(arch='nalaformer_s', drop_path_rate=0.15,
                  init_cfg=dict(checkpoint='checkpoints/nalaformer_s_in1k.pth')),
    neck=dict(in_channels=[64, 128, 320, 512]))
