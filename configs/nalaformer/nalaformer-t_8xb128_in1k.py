# NaLaFormer-T on ImageNet-1K, 8 GPUs x 128 images, release recipe.
_base_ = [
    '../_base_/models/nalaformer.py',
    '../_base_/datasets/imagenet_bs128.py',
    '../_base_/schedules/imagenet_bs1024_adamw_300e.py',
    '../_base_/default_runtime.py',
]
model = dict(arch='nalaformer_t', drop_path_rate=0.1)  # drop path: release NALA.py NALAFORMER_T
