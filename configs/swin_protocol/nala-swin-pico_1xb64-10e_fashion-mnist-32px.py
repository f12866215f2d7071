# A pico NaLa-Swin (global NaLa in stages 1-2, Swin's windowed softmax in 3-4) trained from scratch on
# Fashion-MNIST in ImageFolder layout (a few minutes on a CPU): the end-to-end check of the Swin-T
# protocol models on real images.
#   apt-get install dataset-fashion-mnist
#   python3 tools/dataset_converters/fashion_mnist_to_imagefolder.py data/fashion-mnist
#   python3 tools/train.py configs/swin_protocol/nala-swin-pico_1xb64-10e_fashion-mnist-32px.py
# 32px inputs, 4x4 patches: stage maps 8x8, 4x4 (global NaLa), 2x2, 1x1 (Swin's windows, clamped to the map
# as Swin does when a map is no larger than a window). About 10 minutes on 2 busy CPU cores, ~80% top-1.
_base_ = [
    '../_base_/models/nala_swin_t.py',
    '../_base_/datasets/fashion_mnist_32px.py',
    '../_base_/schedules/pico_adamw_10e.py',
    '../_base_/pico_runtime.py',
]
model = dict(num_classes=10, img_size=32, patch_size=4, embed_dim=16, depths=(1, 1, 2, 1), num_heads=(1, 2, 2, 4),
             drop_path_rate=0.0, mixup=None, label_smoothing=0.1)
optim_wrapper = dict(paramwise_cfg=dict(custom_keys={'relative_position_bias_table': dict(decay_mult=0.0)}))
