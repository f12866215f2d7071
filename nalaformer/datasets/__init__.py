"""Real-pixel datasets built from files that setup installs (Debian's Fashion-MNIST, matplotlib's photograph)."""
from .fashion_mnist import CLASSES, DEFAULT_SRC, read_fashion_mnist, write_brightest_of_four, write_imagefolder
from .scenes import write_scenes

__all__ = ['CLASSES', 'DEFAULT_SRC', 'read_fashion_mnist', 'write_brightest_of_four', 'write_imagefolder', 'write_scenes']
