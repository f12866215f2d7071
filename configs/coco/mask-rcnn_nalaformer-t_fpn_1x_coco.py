# Mask R-CNN + FPN with an ImageNet-1K NaLaFormer-T, COCO 1x (12 epochs, lr steps at 8 and 11),
# AdamW lr 1e-4 wd 1e-4 (the paper's COCO protocol, as PVT), 8 GPUs x 2 images.
#   python3 tools/train.py configs/coco/mask-rcnn_nalaformer-t_fpn_1x_coco.py   (data/coco/, checkpoints/)
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    'mmdet::_base_/datasets/coco_instance.py',
    'mmdet::_base_/schedules/schedule_1x.py',
    '../_base_/det_runtime.py',
]

model = dict(
    backbone=dict(
        _delete_=True,
        type='NaLaBackbone',
        arch='nalaformer_t',
        drop_path_rate=0.1,
        out_indices=(0, 1, 2, 3),
        norm_eval=True,  # the stem's and downsamplers' BatchNorm keep ImageNet statistics at 2 images/GPU
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/nalaformer_t_in1k.pth')),
    neck=dict(in_channels=[64, 128, 256, 512]))

optim_wrapper = dict(optimizer=dict(_delete_=True, type='AdamW', lr=1e-4, weight_decay=1e-4))
