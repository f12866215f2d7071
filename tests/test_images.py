"""The pixel layer (nalaformer.images): the one uint8 conversion, atomic saving, the extensions ImageFolder
class folders hold, and 16-bit images read at their range."""
import numpy as np
import pytest
from PIL import Image
from timm.data.readers.img_extensions import get_img_extensions

from nalaformer.images import (
    IMAGE_FOLDER_EXTENSIONS, ImageError, image_files, read_image, rgb_image, save_image, to_uint8,
)


@pytest.mark.parametrize('pixels, peak, expected', [
    ([0., .5 / 255, 1.5 / 255, 254.5 / 255, 1.], 1., [0, 1, 2, 255, 255]),  # halves away from zero, as MATLAB
    ([-.2, 1.3, np.nan_to_num(np.inf)], 1., [0, 255, 255]),  # saturated
    ([0, 32767.5, 65535], 65535, [0, 128, 255]),  # 16-bit range
])
def test_uint8_conversion_rounds_half_away_from_zero_and_saturates(pixels, peak, expected):
    assert to_uint8(np.array(pixels), peak).tolist() == expected


def test_save_image_leaves_the_old_file_when_writing_fails(tmp_path):
    path = tmp_path / 'a.png'
    save_image(np.full((4, 5, 3), 7, np.uint8), path)
    with pytest.raises(TypeError):
        save_image(np.zeros((4, 5, 3), np.complex64), path)  # Pillow cannot write it
    assert read_image(path).tolist() == np.full((4, 5, 3), 7, np.uint8).tolist()
    assert [p.name for p in tmp_path.iterdir()] == ['a.png']  # no temporary file left


def test_image_folder_extensions_are_what_timms_reader_reads():
    assert set(IMAGE_FOLDER_EXTENSIONS) == set(get_img_extensions())


def test_sixteen_bit_grey_is_scaled_not_clipped(tmp_path):
    image = Image.fromarray(np.array([[0, 65535], [257 * 100, 257 * 200]], np.uint16))
    assert np.asarray(rgb_image(image))[..., 0].tolist() == [[0, 255], [100, 200]]
    image.save(tmp_path / 'deep.png')
    with pytest.raises(ImageError, match=r'deep\.png is a I;16 image'):
        read_image(tmp_path / 'deep.png')


def test_a_folder_without_images_is_named(tmp_path):
    (tmp_path / 'notes.txt').write_text('no images')
    with pytest.raises(ImageError, match=f'folder {tmp_path} holds no images'):
        image_files(tmp_path)
