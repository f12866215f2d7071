# NaLaFormer-XT on ImageNet-1K, 8 GPUs x 128 images, release recipe.
_base_ = [
    '../_base_/models/nalaformer.py',
    '../_base_/datasets/imagenet_bs128.py',
    '../_base_/schedules/imagenet_bs1024_adamw_300e.py',
    '../_base_/default_runtime.py',
]
# drop path 0.1: release NALA.py NALAFORMER_XT (pretrain.sh passes --drop-path 0.05, which the factory ignores)
model = dict(arch='nalaformer_xt', drop_path_rate=0.1)
