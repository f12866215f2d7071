# A pico NaLa-SR learning x2 super-resolution from real photographs on a CPU (the end-to-end check of the SR
# pipeline): trained on the detailed parts of Debian's mate-backgrounds nature photographs, tested on four
# photographs it never saw (OpenCV's butterfly, scikit-image's astronaut, coffee, chelsea) against their
# bicubic upscaling. 2000 iterations of 32 crops of 32x32 HR pixels take a few minutes on 2 cores.
#   bash scripts/setup.sh          # installs mate-backgrounds and opencv-doc
#   python3 tools/dataset_converters/sr_photos.py data/sr-photos
#   python3 tools/train.py configs/sr/nalasr-pico_1xb32-2k_photos-x2.py
#   python3 tools/test.py configs/sr/nalasr-pico_1xb32-2k_photos-x2.py \
#       work_dirs/nalasr-pico_1xb32-2k_photos-x2/iter_2000.pth
_base_ = [
    '../_base_/models/nalasr_light.py',
    '../_base_/datasets/div2k_sr.py',
    '../_base_/schedules/sr_adam_500k.py',
    '../_base_/sr_runtime.py',
]
scale = 2
data_root = 'data/sr-photos'
# pico: 24 channels, 2 groups of 1 layer, 2 heads, 8x8 windows: 0.04M parameters (light: 0.92M)
model = dict(upscale=scale, embed_dim=24, depths=(1, 1), num_heads=2, window_size=8)
train_dataloader = dict(
    batch_size=32, num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root, scale=scale, patch_size=32, cache=True))  # decoded once, cropped from memory
val_dataloader = None  # no validation: one test at the end
val_cfg = None
val_evaluator = None
test_dataloader = dict(num_workers=0, dataset=dict(data_root=data_root, scale=scale))
# A short run: a 15x larger step than the 500k-iteration recipe, halved at 50 / 75 / 90% of the iterations.
optim_wrapper = dict(optimizer=dict(lr=3e-3))
param_scheduler = [dict(type='MultiStepLR', by_epoch=False, milestones=[1000, 1500, 1800], gamma=0.5)]
train_cfg = dict(max_iters=2000, val_interval=2000)
default_hooks = dict(logger=dict(interval=50), checkpoint=dict(interval=500, max_keep_ckpts=2))
