# ImageNet-1K in ImageFolder layout: data/imagenet/{train,val}/<wnid>/*.JPEG
# Augmentation and sampling as the release (NaLaformer/main.py defaults and datasets.py, DeiT's): RandAugment
# rand-m9-mstd0.5-inc1, colour jitter 0.4, bicubic, random erasing 0.25 (pixel, 1), repeated augmentation x3;
# 128 images per GPU (pretrain.sh --batch-size 128 on 8 GPUs); incomplete training batches dropped (main.py
# drop_last=True). RandAugment's Posterize at magnitude 10 keeps 0 bits: a black
# image, as Pillow <= 12.3 gives and the release's stack did (nalaformer/classification/augment.py; docs/recipes.md).
dataset_type = 'ImageFolderDataset'
data_root = 'data/imagenet'

train_dataloader = dict(
    batch_size=128,
    num_workers=8,
    persistent_workers=True,
    pin_memory=True,
    drop_last=True,
    sampler=dict(type='RepeatAugSampler', num_repeats=3, shuffle=True),
    collate_fn=dict(type='default_collate'),
    dataset=dict(
        type=dataset_type, data_root=data_root, split='train', input_size=224,
        transform=dict(auto_augment='rand-m9-mstd0.5-inc1', color_jitter=0.4, interpolation='bicubic',
                       re_prob=0.25, re_mode='pixel', re_count=1)),
)
val_dataloader = dict(
    batch_size=128,
    num_workers=8,
    persistent_workers=True,
    pin_memory=True,
    sampler=dict(type='DefaultSampler', shuffle=False),
    collate_fn=dict(type='default_collate'),
    # resize 256 -> center crop 224
    dataset=dict(type=dataset_type, data_root=data_root, split='val', input_size=224,
                 transform=dict(interpolation='bicubic', crop_pct=224 / 256)),
)
val_evaluator = dict(type='Accuracy', topk=(1, 5))
test_dataloader = val_dataloader
test_evaluator = val_evaluator
