# NaLaFormer-T + UperNet on Cityscapes (19 classes), 80k iterations at 8 GPUs x 2 images, 512x1024 crops.
# The paper reports no Cityscapes result and gives no Cityscapes protocol: this is the ADE20K UperNet recipe
# over mmseg's usual Cityscapes schedule. Testing slides a training-sized window over the 1024x2048 images.
_base_ = [
    '../_base_/models/upernet_nalaformer.py', 'mmseg::_base_/datasets/cityscapes.py',
    '../_base_/seg_runtime.py', '../_base_/schedules/seg_adamw_80k.py'
]
crop_size = (512, 1024)
model = dict(
    data_preprocessor=dict(size=crop_size),
    backbone=dict(
        arch='nalaformer_t',
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/nalaformer_t_in1k.pth')),
    decode_head=dict(in_channels=[64, 128, 256, 512], num_classes=19),
    auxiliary_head=dict(in_channels=256, num_classes=19),
    test_cfg=dict(mode='slide', crop_size=crop_size, stride=(384, 768)))
train_dataloader = dict(batch_size=2)
