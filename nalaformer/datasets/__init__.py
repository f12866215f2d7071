"""Real-pixel datasets built from files that setup installs (Debian's Fashion-MNIST, matplotlib's photograph,
Debian's mate-backgrounds and opencv-doc photographs, scikit-image's bundled images), and the ImageNet validation
images sorted into class folders."""
from .fashion_mnist import CLASSES, DEFAULT_SRC, read_fashion_mnist, write_brightest_of_four, write_imagefolder
from .imagenet_val import flat_images, read_ground_truth, sort_val_images
from .scenes import write_scenes
from .super_resolution import write_lr_images, write_photo_datasets, write_photo_test_set, write_photo_training_set

__all__ = ['CLASSES', 'DEFAULT_SRC', 'read_fashion_mnist', 'write_brightest_of_four', 'write_imagefolder', 'write_scenes',
           'write_lr_images', 'write_photo_datasets', 'write_photo_test_set', 'write_photo_training_set',
           'flat_images', 'read_ground_truth', 'sort_val_images']
