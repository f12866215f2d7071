# Mask R-CNN + FPN with NaLaFormer-T, COCO 3x: the 3x protocol of Swin, FLatten and VMamba, as in mmdet's
# configs/swin/mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py: 36 epochs (lr x 0.1 at 27 and 33), 1000 warm-up
# iterations, and multi-scale training with DETR's crop branch: after a flip, either the shorter side drawn
# from 480..800 (step 32, longer side at most 1333), or the shorter side drawn from {400, 500, 600}, a random
# 384..600 crop, then the 480..800 resize. AdamW lr 1e-4, wd 1e-4 as in the 1x configs (the paper's COCO
# setup; Swin's 3x uses wd 0.05).
_base_ = ['./mask-rcnn_nalaformer-t_fpn_1x_coco.py']

multi_scale = [(1333, short) for short in range(480, 801, 32)]
train_pipeline = [
    dict(type='LoadImageFromFile', backend_args={{_base_.backend_args}}),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='RandomChoice', transforms=[
        [dict(type='RandomChoiceResize', scales=multi_scale, keep_ratio=True)],
        [dict(type='RandomChoiceResize', scales=[(1333, 400), (1333, 500), (1333, 600)], keep_ratio=True),
         dict(type='RandomCrop', crop_type='absolute_range', crop_size=(384, 600), allow_negative_crop=True),
         dict(type='RandomChoiceResize', scales=multi_scale, keep_ratio=True)],
    ]),
    dict(type='PackDetInputs'),
]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))

max_epochs = 36
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=1000),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[27, 33], gamma=0.1),
]
