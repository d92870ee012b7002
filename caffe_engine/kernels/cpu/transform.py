"""The Data layer's transform on the CPU: crop, mirror, mean and scale in one pass in Numba.

Per element, in float32 as the reference (and Caffe): ``(x - mean) * scale``, ``x * scale``
without a mean, the mean read at the uncropped position (a mean file) or per channel (mean
values); mirrored images written with their columns reversed. Results equal the reference
kernels' bit for bit. Runs on the calling thread without the GIL (the Data layer's prefetch
thread or its data threads), image after image.
"""
import numpy
from numba import njit

f32 = numpy.float32


@njit(cache=True, nogil=True, error_model="numpy")
def transform_batch(batch, out, params, mean, mean_kind, scale):
    """``out`` (N, C, OH, OW) float32 from ``batch`` (N, C, H, W) uint8 or float32.

    ``params`` int64 (N, 3) ``[mirror, h_off, w_off]``; ``mean`` float32, (C, H, W) when
    ``mean_kind`` is 2, (C, 1, 1) when 1, unused when 0; ``scale`` float32 (1: not applied).
    """
    n, c, _, _ = batch.shape
    oh, ow = out.shape[2], out.shape[3]
    scaled = scale != f32(1)
    for i in range(n):
        mirror, h0, w0 = params[i, 0], params[i, 1], params[i, 2]
        for ch in range(c):
            for r in range(oh):
                for col in range(ow):
                    v = f32(batch[i, ch, h0 + r, w0 + col])
                    if mean_kind == 2:
                        v = v - mean[ch, h0 + r, w0 + col]
                    elif mean_kind == 1:
                        v = v - mean[ch, 0, 0]
                    if scaled:
                        v = v * scale
                    out[i, ch, r, ow - 1 - col if mirror else col] = v


def transform(batch, out, params, mean, scale):
    """The cpu set's ``transform``: same arguments and results as the reference one."""
    if mean is None:
        kind, mean = 0, numpy.zeros((1, 1, 1), f32)
    else:
        kind = 1 if mean.shape[1:] == (1, 1) else 2
        mean = numpy.ascontiguousarray(mean, f32)
    # Records may be strided views (a decoded (H, W, C) image seen as (C, H, W)): compiled for
    # that layout rather than copied.
    transform_batch(numpy.asarray(batch), out, numpy.ascontiguousarray(params),
                    mean, kind, f32(scale))
