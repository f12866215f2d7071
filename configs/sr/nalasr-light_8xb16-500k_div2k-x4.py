# NaLa-SR light, x4, on DIV2K: the authors' lightweight-SR recipe on 8 GPUs x 16 images
# (PolaFormerPP downstream/sr/options/train/mambairv2/train_MambaIRv2_lightSR_x4.yml). Its pretrain_network_g is
# left empty ("set your Pola++ checkpoint path", strict_load_g false): whether the authors' x4 model started
# from another checkpoint is not known; this config trains from scratch.
#   bash tools/dist_train.sh configs/sr/nalasr-light_8xb16-500k_div2k-x4.py 8
#   python3 tools/test.py configs/sr/nalasr-light_8xb16-500k_div2k-x4.py work_dirs/.../iter_500000.pth
_base_ = [
    '../_base_/models/nalasr_light.py',
    '../_base_/datasets/div2k_sr.py',
    '../_base_/schedules/sr_adam_500k.py',
    '../_base_/sr_runtime.py',
]
scale = 4
model = dict(upscale=scale)
train_dataloader = dict(dataset=dict(scale=scale))
val_dataloader = dict(dataset=dict(scale=scale, sets=['Set5']))  # the x4 file validates on Set5
test_dataloader = dict(dataset=dict(scale=scale))
# BasicSR's save_best: the checkpoint of the best validation PSNR is kept (best_Set5_PSNR_iter_N.pth)
default_hooks = dict(checkpoint=dict(save_best='Set5/PSNR', rule='greater'))
