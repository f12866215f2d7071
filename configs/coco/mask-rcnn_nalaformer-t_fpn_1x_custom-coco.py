# Fine-tune Mask R-CNN + NaLaFormer-T on your own COCO-format data (any number of classes):
#   data/my_dataset/annotations/{train,val}.json     COCO json: images, annotations (bbox, polygon or
#   data/my_dataset/images/{train,val}/*.jpg          RLE segmentation), categories named as in `classes`
#   python3 tools/train.py configs/coco/mask-rcnn_nalaformer-t_fpn_1x_custom-coco.py
# Starts from ImageNet weights (model.backbone.init_cfg); to start from a COCO-trained detector instead,
# add --cfg-options load_from=work_dirs/mask-rcnn_nalaformer-t_fpn_1x_coco/epoch_12.pth (the class-specific
# head layers, whose shapes differ, are skipped with a warning and trained from scratch).
_base_ = ['./mask-rcnn_nalaformer-t_fpn_1x_coco.py']

data_root = 'data/my_dataset/'
classes = ('cat', 'dog')  # your json's category names, in the order of its 'categories' list
metainfo = dict(classes=classes)

model = dict(roi_head=dict(bbox_head=dict(num_classes=len(classes)), mask_head=dict(num_classes=len(classes))))

train_dataloader = dict(
    dataset=dict(data_root=data_root, metainfo=metainfo,
                 ann_file='annotations/train.json', data_prefix=dict(img='images/train/')))
val_dataloader = dict(
    dataset=dict(data_root=data_root, metainfo=metainfo,
                 ann_file='annotations/val.json', data_prefix=dict(img='images/val/')))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/val.json')
test_evaluator = val_evaluator
