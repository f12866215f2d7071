# A pico NaLaFormer trained from scratch on Fashion-MNIST in ImageFolder layout (a few minutes on
# a CPU): the end-to-end check of the classification pipeline on real images.
#   apt-get install dataset-fashion-mnist
#   python3 tools/dataset_converters/fashion_mnist_to_imagefolder.py data/fashion-mnist
#   python3 tools/train.py configs/nalaformer/nalaformer-pico_1xb64-10e_fashion-mnist-32px.py
_base_ = [
    '../_base_/models/nalaformer.py',
    '../_base_/datasets/fashion_mnist_32px.py',
    '../_base_/schedules/pico_adamw_10e.py',
    '../_base_/pico_runtime.py',
]
model = dict(num_classes=10, embed_dims=(16, 32, 48, 64), depths=(1, 1, 1, 1), num_heads=(1, 1, 1, 2),
             head_hidden_size=128, drop_path_rate=0.0, mixup=None, label_smoothing=0.1)
optim_wrapper = dict(paramwise_cfg=dict(
    custom_keys={'gamma_1': dict(decay_mult=0.0), 'gamma_2': dict(decay_mult=0.0)}))
