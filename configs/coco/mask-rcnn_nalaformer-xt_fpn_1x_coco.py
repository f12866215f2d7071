# NaLaFormer-XT: Mask R-CNN + FPN, COCO 1x.
# Drop path 0.1 as on ImageNet; everything else as for NaLaFormer-T.
_base_ = ['./mask-rcnn_nalaformer-t_fpn_1x_coco.py']

model = dict(
    backbone=dict(arch='nalaformer_xt', drop_path_rate=0.1,
                  init_cfg=dict(checkpoint='checkpoints/nalaformer_xt_in1k.pth')),
    neck=dict(in_channels=[32, 64, 128, 384]))
