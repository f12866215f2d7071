# NaLaFormer-B: Mask R-CNN + FPN, COCO 1x.
# Drop path 0.4 as on ImageNet; everything else as for NaLaFormer-T.
_base_ = ['./mask-rcnn_nalaformer-t_fpn_1x_coco.py']

model = dict(
    backbone=dict(arch='nalaformer_b', drop_path_rate=0.4,
                  init_cfg=dict(checkpoint='checkpoints/nalaformer_b_in1k.pth')),
    neck=dict(in_channels=[96, 192, 384, 512]))
