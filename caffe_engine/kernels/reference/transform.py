"""The Data layer's transform of raw records, in readable array code.

Caffe: src/caffe/data_transformer.cpp (``Transform(const Datum&, Blob*)``): per element, in
float32, ``(x - mean) * scale`` (``x * scale`` without a mean), ``x`` the uint8 (or float)
value of the uncropped record, the mean taken at the same (uncropped) position, or per channel;
an image is mirrored by reversing its columns after the crop.
"""
import numpy

f32 = numpy.float32


def transform(batch, out, params, mean, scale):
    """Write the transformed ``batch`` into ``out``.

    Args:
        batch: (N, C, H, W) uint8 or float32 NumPy array, the records.
        out: (N, C, OH, OW) float32 NumPy array (``OH``, ``OW`` the crop, or H, W).
        params: int64 (N, 3): per image ``[mirror, h_off, w_off]``.
        mean: None, float32 (C, H, W) (a mean file) or float32 (C, 1, 1) (mean values).
        scale: float32.
    """
    oh, ow = out.shape[2:]
    full_mean = mean is not None and mean.shape[1:] != (1, 1)
    for i in range(batch.shape[0]):
        mirror, h_off, w_off = (int(v) for v in params[i])
        window = (slice(None), slice(h_off, h_off + oh), slice(w_off, w_off + ow))
        dest = out[i, :, :, ::-1] if mirror else out[i]
        if mean is None:
            dest[...] = batch[i][window]
        else:
            numpy.subtract(batch[i][window], mean[window] if full_mean else mean, out=dest,
                           dtype=f32)
    if scale != 1:
        out *= scale
