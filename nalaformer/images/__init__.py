"""The ground floor for pixels: image files, uint8 conversion, MATLAB's bicubic resize, PSNR / SSIM.

numpy, Pillow and scikit-image only (no torch): dataset writers and converters stand on it.
"""
from .io import (
    IMAGE_EXTENSIONS, IMAGE_FOLDER_EXTENSIONS, ImageError, image_files, image_size, read_image, rgb_image, save_image,
    to_uint8,
)
from .quality import calculate_psnr, calculate_ssim
from .resize import imresize
