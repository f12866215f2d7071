# Fashion-MNIST in ImageFolder layout at 32x32 (a real-data check that runs on a CPU):
#   apt-get install dataset-fashion-mnist
#   python3 tools/dataset_converters/fashion_mnist_to_imagefolder.py data/fashion-mnist
_base_ = ['./imagenet_bs128.py']
data_root = 'data/fashion-mnist'
augment = dict(_delete_=True, hflip=0.5, scale=(0.8, 1.0), ratio=(0.9, 1.1), color_jitter=0.0, interpolation='bicubic')
train_dataloader = dict(
    batch_size=64, num_workers=2, persistent_workers=False, pin_memory=False,
    sampler=dict(_delete_=True, type='DefaultSampler', shuffle=True),
    dataset=dict(data_root=data_root, input_size=32, transform=augment))
val_dataloader = dict(
    batch_size=128, num_workers=2, persistent_workers=False, pin_memory=False,
    dataset=dict(data_root=data_root, input_size=32, transform=dict(interpolation='bicubic', crop_pct=1.0)))
test_dataloader = val_dataloader
