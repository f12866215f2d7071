# A pico NaLa-Swin ('LLSS': global NaLa in stages 1-2, Swin's windowed softmax in 3-4) trained from scratch on
# Fashion-MNIST in ImageFolder layout (a few minutes on a CPU): the end-to-end check of the Swin-T
# protocol models on real images.
#   apt-get install dataset-fashion-mnist
#   python tools/dataset_converters/fashion_mnist_to_imagefolder.py data/fashion-mnist
#   python tools/train.py configs/swin_protocol/nala-swin-pico_1xb64-10e_fashion-mnist-32px.py
# 32px inputs, 4x4 patches: stage maps 8x8, 4x4 (global NaLa), 2x2, 1x1 (Swin's windows, clamped to the map
# as Swin does when a map is no larger than a window). About 10 minutes on 2 busy CPU cores, ~80% top-1.
_base_ = [
    '../_base_/models/nala_swin_t.py',
    '../_base_/datasets/imagenet_bs128.py',
    '../_base_/default_runtime.py',
]
data_root = 'data/fashion-mnist'
model = dict(num_classes=10, img_size=32, patch_size=4, embed_dim=16, depths=(1, 1, 2, 1), num_heads=(1, 2, 2, 4),
             drop_path_rate=0.0, mixup=None, label_smoothing=0.1)
augment = dict(_delete_=True, hflip=0.5, scale=(0.8, 1.0), ratio=(0.9, 1.1), color_jitter=0.0, interpolation='bicubic')
train_dataloader = dict(
    batch_size=64, num_workers=2, persistent_workers=False, pin_memory=False,
    sampler=dict(_delete_=True, type='DefaultSampler', shuffle=True),
    dataset=dict(data_root=data_root, input_size=32, transform=augment))
val_dataloader = dict(
    batch_size=128, num_workers=2, persistent_workers=False, pin_memory=False,
    dataset=dict(data_root=data_root, input_size=32, transform=dict(interpolation='bicubic', crop_pct=1.0)))
test_dataloader = val_dataloader
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=3e-3, weight_decay=0.05),
    paramwise_cfg=dict(norm_decay_mult=0.0, bias_decay_mult=0.0,
                       custom_keys={'relative_position_bias_table': dict(decay_mult=0.0)}))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.1, by_epoch=True, begin=0, end=1, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=1, end=10, convert_to_iter_based=True),
]
train_cfg = dict(by_epoch=True, max_epochs=10, val_interval=1)
val_cfg = dict()
test_cfg = dict()
default_hooks = dict(logger=dict(interval=20), checkpoint=dict(max_keep_ckpts=1))
custom_hooks = [
    dict(type='DualEMAHook', momentum=2e-2, update_buffers=True),
    dict(type='EpochSeedHook'),
    dict(type='ResumableCheckpointHook'),
]
