# DIV2K (bicubic LR) for training, the benchmark sets for validation and testing, as BasicSR reads them:
#   data/DIV2K/DIV2K_train_HR/*.png, data/DIV2K/DIV2K_train_LR_bicubic/X{2,3,4}/*x{2,3,4}.png
#   data/benchmark/<Set>/HR/*.png, data/benchmark/<Set>/LR_bicubic/X{2,3,4}/*x{2,3,4}.png
# (tools/dataset_converters/bicubic_downsample.py writes missing LR folders). Experiments set `scale`
# (x2 also its HR patch); testing reads every set under data/benchmark (the paper's: Set5, Set14, B100,
# Urban100, Manga109).
data_root = 'data'
scale = 2
train_dataloader = dict(
    batch_size=16,  # per GPU (batch_size_per_gpu: 16)
    num_workers=8,  # num_worker_per_gpu: 8
    persistent_workers=True,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    collate_fn=dict(type='default_collate'),
    dataset=dict(type='SRPairedDataset', data_root=data_root, scale=scale, patch_size=192,  # HR crop (gt_size)
                 flip=True, rotate=True))  # use_hflip, use_rot
val_dataloader = dict(
    batch_size=1, num_workers=2, persistent_workers=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    collate_fn=dict(type='default_collate'),
    dataset=dict(type='SRBenchmarkDataset', data_root=data_root, scale=scale, sets=['Set5']))
test_dataloader = dict(
    batch_size=1, num_workers=2, persistent_workers=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    collate_fn=dict(type='default_collate'),
    dataset=dict(type='SRBenchmarkDataset', data_root=data_root, scale=scale))
# PSNR / SSIM on the Y channel, border = scale (test_y_channel: true, crop_border: scale), bicubic alongside
val_evaluator = dict(type='SRMetric')
test_evaluator = val_evaluator
