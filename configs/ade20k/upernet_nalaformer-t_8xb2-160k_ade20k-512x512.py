# NaLaFormer-T + UperNet on ADE20K, 160k iterations at 8 GPUs x 2 images, 512x512 crops.
# Paper (v1): 46.9 mIoU. Multi-scale + flip test: tools/test.py CONFIG CKPT --tta
_base_ = [
    '../_base_/models/upernet_nalaformer.py', 'mmseg::_base_/datasets/ade20k.py',
    '../_base_/seg_runtime.py', '../_base_/schedules/seg_adamw_160k.py'
]
crop_size = (512, 512)
model = dict(
    data_preprocessor=dict(size=crop_size),
    backbone=dict(
        arch='nalaformer_t',
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/nalaformer_t_in1k.pth')),
    decode_head=dict(in_channels=[64, 128, 256, 512], num_classes=150),
    auxiliary_head=dict(in_channels=256, num_classes=150))
train_dataloader = dict(batch_size=2)
