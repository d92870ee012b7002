"""Encoded Datum records (JPEG/PNG bytes, ``encoded: true``) as Caffe's DataTransformer and
DataLayer take them (src/caffe/data_transformer.cpp, src/caffe/util/io.cpp
``DecodeDatumToCVMat*``, src/caffe/layers/data_layer.cpp), on images made here:

* the decode modes: native (the file's own channels: grey 1; RGB 3 as BGR; RGBA, grey+alpha and
  palette-with-transparency 4 as BGRA; a plain palette 3), ``force_color`` (3, BGR, alpha
  dropped), ``force_gray`` (1), both forced (Caffe's error); the EXIF orientation applied by the
  forced decodes only; 16-bit samples refused as Caffe's "unsigned byte" check;
* JPEG variants (baseline 4:2:0 and 4:4:4, progressive, grey) decoded as OpenCV decodes them,
  and the same as Pillow's libjpeg-turbo in colour (the measured reason either library gives
  Caffe's pixels);
* records of a batch: the first one's shape; others differing in size only with a crop, each
  cropped by its own random draws; mixed raw and encoded databases; a truncated JPEG and other
  bad records named by database and key.

The oracle for pixel values is the lossless source array itself where the format is lossless
(PNG), and OpenCV's ``imdecode`` (what Caffe calls) for JPEG.
"""
import io

import numpy
import pytest
from google.protobuf import text_format

from caffe_engine import rng
from caffe_engine.data_transformer import DataTransformer
from caffe_engine.errors import CaffeError
from caffe_engine.io.lmdb_source import write_lmdb
from caffe_engine.proto import caffe_pb2
from caffe_engine.rng import CaffeRNG
import tiny_data
from tiny_data import batches

cv2 = pytest.importorskip("cv2")
Image = pytest.importorskip("PIL.Image")

F32 = numpy.float32


# -- images made here ------------------------------------------------------------------------------
def picture(h, w, c=3, seed=0):
    """A smooth uint8 image (H, W, C) with some noise: JPEG-friendly, every value exercised."""
    r = numpy.random.RandomState(seed)
    y, x = numpy.mgrid[0:h, 0:w]
    planes = [(x * (3 + k) + y * (5 - k) + 40 * k) % 256 for k in range(c)]
    image = numpy.stack(planes, -1).astype(numpy.int64) + r.randint(-12, 13, (h, w, c))
    return numpy.clip(image, 0, 255).astype(numpy.uint8)


def pil_bytes(array, mode, fmt="PNG", **options):
    out = io.BytesIO()
    Image.fromarray(array, mode).save(out, format=fmt, **options)
    return out.getvalue()


def cv_bytes(ext, image, *params):
    ok, buf = cv2.imencode(ext, image, list(params))
    assert ok
    return buf.tobytes()


def encoded(data, label=0):
    return caffe_pb2.Datum(data=data, label=label, encoded=True)


def raw(chw, label=0):
    c, h, w = chw.shape
    return caffe_pb2.Datum(channels=c, height=h, width=w, data=chw.tobytes(), label=label)


def transformer(text="", phase=caffe_pb2.TEST):
    param = text_format.Parse(text, caffe_pb2.TransformationParameter())
    t = DataTransformer(param, phase)
    rng.set_random_seed(5)
    t.init_rand()
    return t


def pixels(datum, text=""):
    """The (C, H, W) pixels the transformer decodes ``datum`` to, as a contiguous array."""
    return numpy.ascontiguousarray(transformer(text).record_pixels(datum))


# -- the decode modes ------------------------------------------------------------------------------
RGB = picture(13, 7, 3, seed=1)           # odd sizes throughout
GREY = picture(9, 11, 1, seed=2)[:, :, 0]
ALPHA = picture(13, 7, 1, seed=3)[:, :, 0]


def palette_png(transparency):
    """A 4-colour palette PNG of RGB's size: (bytes, its RGB pixels (H, W, 3))."""
    index = (RGB[:, :, 0] // 64).astype(numpy.uint8)
    colours = numpy.array([[10, 20, 30], [200, 100, 0], [0, 255, 128], [90, 90, 250]], numpy.uint8)
    img = Image.fromarray(index, "P")
    img.putpalette(colours.ravel().tolist())
    out = io.BytesIO()
    img.save(out, format="PNG", **({"transparency": 1} if transparency else {}))
    alpha = numpy.where(index == 1, 0, 255).astype(numpy.uint8)
    return out.getvalue(), colours[index], alpha


def test_native_decode_keeps_each_files_own_channels():
    bgr = RGB[:, :, ::-1]
    # grey 1; RGB -> BGR 3; RGBA -> BGRA 4; grey+alpha -> BGRA 4 (the grey replicated).
    cases = [
        (pil_bytes(GREY, "L"), GREY[None]),
        (pil_bytes(RGB, "RGB"), bgr.transpose(2, 0, 1)),
        (pil_bytes(numpy.dstack([RGB, ALPHA]), "RGBA"),
         numpy.dstack([bgr, ALPHA]).transpose(2, 0, 1)),
        (pil_bytes(numpy.dstack([RGB[:, :, 0], ALPHA]), "LA"),
         numpy.stack([RGB[:, :, 0]] * 3 + [ALPHA])),
    ]
    plain, colours, _ = palette_png(False)
    cases.append((plain, colours[:, :, ::-1].transpose(2, 0, 1)))          # palette: BGR 3
    with_alpha, colours, alpha = palette_png(True)
    cases.append((with_alpha, numpy.dstack([colours[:, :, ::-1], alpha]).transpose(2, 0, 1)))
    for data, want in cases:
        got = pixels(encoded(data))
        assert got.dtype == numpy.uint8
        numpy.testing.assert_array_equal(got, want)


def test_force_color_and_force_gray():
    grey_png = encoded(pil_bytes(GREY, "L"))
    rgb_png = encoded(pil_bytes(RGB, "RGB"))
    rgba_png = encoded(pil_bytes(numpy.dstack([RGB, ALPHA]), "RGBA"))
    numpy.testing.assert_array_equal(pixels(grey_png, "force_color: true"), numpy.stack([GREY] * 3))
    numpy.testing.assert_array_equal(pixels(rgba_png, "force_color: true"),
                                     RGB[:, :, ::-1].transpose(2, 0, 1))      # alpha dropped
    # A colour PNG in grey: libpng's own conversion, as OpenCV asks for it.
    r, g, b = (RGB[:, :, i].astype(numpy.int64) for i in range(3))
    numpy.testing.assert_array_equal(pixels(rgb_png, "force_gray: true")[0],
                                     (r * 9797 + g * 19234 + b * 3737) >> 15)
    assert pixels(grey_png, "force_gray: true").shape == (1, 9, 11)
    with pytest.raises(CaffeError, match="cannot set both force_color and force_gray"):
        pixels(rgb_png, "force_color: true force_gray: true")
    # Raw records ignore the flags (Caffe logs that they only apply to encoded ones).
    numpy.testing.assert_array_equal(pixels(raw(GREY[None]), "force_color: true"), GREY[None])


@pytest.mark.parametrize("variant", ["baseline-420", "baseline-444", "progressive", "grey"])
def test_jpeg_variants_decode_as_opencv_and_as_libjpeg_turbo(variant):
    image = picture(37, 53, 3, seed=4)
    if variant == "grey":
        data = cv_bytes(".jpg", cv2.cvtColor(image, cv2.COLOR_BGR2GRAY))
    elif variant == "progressive":
        data = cv_bytes(".jpg", image, cv2.IMWRITE_JPEG_PROGRESSIVE, 1)
    else:
        factor = {"baseline-420": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420,
                  "baseline-444": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444}[variant]
        data = cv_bytes(".jpg", image, cv2.IMWRITE_JPEG_SAMPLING_FACTOR, factor)
    buf = numpy.frombuffer(data, numpy.uint8)
    native = pixels(encoded(data))
    colour = pixels(encoded(data), "force_color: true")
    grey = pixels(encoded(data), "force_gray: true")
    assert native.shape == ((1, 37, 53) if variant == "grey" else (3, 37, 53))
    numpy.testing.assert_array_equal(colour, cv2.imdecode(buf, cv2.IMREAD_COLOR).transpose(2, 0, 1))
    numpy.testing.assert_array_equal(grey[0], cv2.imdecode(buf, cv2.IMREAD_GRAYSCALE))
    # Pillow's libjpeg-turbo gives the same colour pixels (RGB there, BGR here).
    with Image.open(io.BytesIO(data)) as img:
        numpy.testing.assert_array_equal(colour, numpy.asarray(img.convert("RGB"))[:, :, ::-1]
                                         .transpose(2, 0, 1))
    # Lossy (the noise and, in 4:2:0, the halved chroma), but the same picture.
    source = image if variant != "grey" else cv2.cvtColor(image, cv2.COLOR_BGR2GRAY)[:, :, None]
    assert numpy.abs(native.transpose(1, 2, 0).astype(int) - source).mean() < 15


def test_exif_orientation_only_with_the_force_flags():
    """OpenCV (3.1 and later) applies the EXIF orientation in IMREAD_COLOR/GRAYSCALE, not in
    IMREAD_UNCHANGED: a forced decode is rotated, Caffe's native decode is not."""
    image = numpy.zeros((20, 30, 3), numpy.uint8)
    image[:5, :10] = 255                                   # a white block at the top left
    img = Image.fromarray(image)
    exif = img.getexif()
    exif[0x0112] = 6                                       # "rotate 90 degrees clockwise"
    out = io.BytesIO()
    img.save(out, format="JPEG", quality=95, exif=exif.tobytes())
    datum = encoded(out.getvalue())
    native = pixels(datum)
    colour = pixels(datum, "force_color: true")
    grey = pixels(datum, "force_gray: true")
    assert native.shape == (3, 20, 30)
    assert colour.shape == (3, 30, 20) and grey.shape == (1, 30, 20)
    assert native[:, :5, :10].mean() > 200 and colour[:, :10, -5:].mean() > 200
    assert grey[0, :10, -5:].mean() > 200 and grey[0, -10:, :5].mean() < 50


def test_sixteen_bit_samples_are_refused_natively_and_narrowed_when_forced():
    deep = (picture(6, 5, 3, seed=6).astype(numpy.uint16) * 257)
    datum = encoded(cv_bytes(".png", deep))
    with pytest.raises(CaffeError, match="unsigned byte"):
        pixels(datum)
    colour = pixels(datum, "force_color: true")
    assert colour.dtype == numpy.uint8
    numpy.testing.assert_array_equal(colour, (deep >> 8).astype(numpy.uint8).transpose(2, 0, 1))


def test_undecodable_bytes_are_refused_naming_the_record():
    data = cv_bytes(".jpg", picture(16, 16))
    for broken in (data[:len(data) // 2], b"", b"not an image at all", b"\x89PNG\r\n\x1a\n" + bytes(30)):
        with pytest.raises(CaffeError, match="record 'k1' of 'db': could not decode"):
            transformer().record_pixels(encoded(broken), "record 'k1' of 'db'")


# -- the Data layer: batches of records ------------------------------------------------------------
def make_db(path, datums):
    write_lmdb(path, [(b"%08d_img" % i, d.SerializeToString()) for i, d in enumerate(datums)])
    return str(path)


def data_layer(source, transform="", batch=4, phase=caffe_pb2.TRAIN, prefetch=4):
    return tiny_data.data_layer(source, prefetch, transform, batch, phase)


def test_mixed_raw_and_encoded_database_equals_the_raw_one(tmp_path):
    images = [picture(10 + i % 3, 12, 3, seed=i) for i in range(10)]
    chw = [im[:, :, ::-1].transpose(2, 0, 1).copy() for im in images]      # BGR, as decoded
    all_raw = make_db(tmp_path / "raw", [raw(c, i) for i, c in enumerate(chw)])
    mixed = make_db(tmp_path / "mixed", [raw(c, i) if i % 2 else
                                         encoded(pil_bytes(images[i], "RGB"), i)
                                         for i, c in enumerate(chw)])
    transform = "crop_size: 8 mirror: true scale: 0.5 mean_value: 3 mean_value: 4 mean_value: 5"
    a = batches(*data_layer(all_raw, transform), 6)
    b = batches(*data_layer(mixed, transform), 6)
    for (da, la), (db, lb) in zip(a, b):
        assert da.tobytes() == db.tobytes() and numpy.array_equal(la, lb)


def test_records_of_other_sizes_are_cropped_each_by_its_own_draws(tmp_path):
    sizes = [(9, 12), (14, 10), (9, 9), (20, 31), (9, 12)]
    images = [picture(h, w, 3, seed=i) for i, (h, w) in enumerate(sizes)]
    source = make_db(tmp_path / "db", [encoded(pil_bytes(im, "RGB"), i)
                                       for i, im in enumerate(images)])
    layer, top = data_layer(source, "crop_size: 9 mirror: true", batch=5, prefetch=0)
    stream = CaffeRNG(layer.transformer.rng.seed)
    (data, label), = batches(layer, top, 1)
    assert data.shape == (5, 3, 9, 9) and label.tolist() == [0, 1, 2, 3, 4]
    for n, (image, (h, w)) in enumerate(zip(images, sizes)):
        mirror, h_off, w_off = stream.word() % 2, stream.word() % (h - 8), stream.word() % (w - 8)
        want = image[h_off:h_off + 9, w_off:w_off + 9, ::-1].transpose(2, 0, 1)
        if mirror:
            want = want[:, :, ::-1]
        numpy.testing.assert_array_equal(data[n], want)
        assert layer.transformer.last_params[n].tolist() == [mirror, h_off, w_off]
    # TEST: the centre of each.
    layer, top = data_layer(source, "crop_size: 9", batch=5, phase=caffe_pb2.TEST, prefetch=0)
    (data, _), = batches(layer, top, 1)
    for n, (image, (h, w)) in enumerate(zip(images, sizes)):
        top_, left = (h - 9) // 2, (w - 9) // 2
        numpy.testing.assert_array_equal(
            data[n], image[top_:top_ + 9, left:left + 9, ::-1].transpose(2, 0, 1))


@pytest.mark.parametrize("records, transform, message", [
    ([(9, 12, 3), (9, 13, 3)], "", r"record '00000001_img' of '.*db' is 9x13, the batch's "
                                   r"first record 9x12: without crop_size"),
    ([(9, 12, 3), (9, 12, 1)], "crop_size: 8", "record '00000001_img' of '.*db' has 1 channels"),
    ([(9, 12, 3), (7, 12, 3)], "crop_size: 8", "crop_size 8 is larger than the 7x12 input"),
])
def test_records_that_do_not_fit_the_batch_are_refused(tmp_path, records, transform, message):
    datums = [encoded(pil_bytes(picture(h, w, c, seed=i)[:, :, :c].squeeze(), "RGB" if c == 3
                                else "L")) for i, (h, w, c) in enumerate(records)]
    layer, top = data_layer(make_db(tmp_path / "db", datums), transform, batch=2)
    with pytest.raises(CaffeError, match=message):
        layer.forward([], top)


def test_a_truncated_jpeg_is_named_by_key_and_database(tmp_path):
    good = cv_bytes(".jpg", picture(12, 12))
    source = make_db(tmp_path / "db", [encoded(good), encoded(good), encoded(good[:-200])])
    layer, top = data_layer(source, batch=3)
    with pytest.raises(CaffeError, match=r"record '00000002_img' of '.*db': could not decode"):
        layer.forward([], top)


def test_a_mean_file_fits_every_record(tmp_path):
    from caffe_engine.io.blobproto import write_blobproto
    mean = numpy.full((1, 3, 9, 12), 7, numpy.float32)
    write_blobproto(str(tmp_path / "mean.binaryproto"), mean)
    datums = [encoded(pil_bytes(picture(h, 12, 3, seed=h), "RGB")) for h in (9, 9, 10)]
    layer, top = data_layer(make_db(tmp_path / "db", datums),
                            f'crop_size: 8 mean_file: "{tmp_path}/mean.binaryproto"', batch=3)
    with pytest.raises(CaffeError, match=r"mean file's shape .* does not match the 3x10x12 input"):
        layer.forward([], top)
