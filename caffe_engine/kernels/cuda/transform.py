"""The Data layer's transform on the device: crop, mirror, mean and scale in one kernel.

Caffe: src/caffe/data_transformer.cpp (``Transform(const Datum&, Blob*)``; Caffe itself runs
it on the CPU). One thread per output element: it reads the record's value at the uncropped
position (the column reversed for a mirrored image), converts it to float32, subtracts the mean
at that uncropped position (a mean file) or the channel's mean (mean values), multiplies by
``scale`` when it is not 1, and writes ``(x - mean) * scale`` -- two float32 roundings, as the
reference set (:func:`..reference.transform.transform`), so the results are equal bit for bit.
A subtraction followed by a multiplication cannot be contracted into a multiply-add, so no
rounding intrinsics are needed. The kernel is a template on the record type, instantiated for
uint8 and float32 records by two ``extern "C"`` wrappers.
"""
import numpy

from ...backend import get_array_module
from ..reference import transform as reference
from .device import float32, int32
from .source import Source

f32 = numpy.float32

_PARAMS = r"""(const int count, const {T}* batch, float* out,
    const int* params, const float* mean, const int mean_kind, const int scaled,
    const float scale, const int channels, const int height, const int width, const int out_h,
    const int out_w)"""

_CODE = r"""
// mean_kind: 0 no mean, 1 one value per channel (mean[c]), 2 a (C, H, W) mean file read at
// the uncropped position. params: per image [mirror, h_off, w_off].
template <typename T>
__device__ __forceinline__ void ce_transform_body""" + _PARAMS.format(T="T") + r""" {
  CE_KERNEL_LOOP(index, count) {
    const int col = index % out_w;
    const int row = (index / out_w) % out_h;
    const int c = (index / out_w / out_h) % channels;
    const int image = index / out_w / out_h / channels;
    const int* p = params + 3 * image;
    const int h = p[1] + row;
    const int w = p[2] + (p[0] ? out_w - 1 - col : col);
    const long long at = ((long long)c * height + h) * width + w;
    float v = (float)batch[(long long)image * channels * height * width + at];
    if (mean_kind == 2) {
      v = v - mean[at];
    } else if (mean_kind == 1) {
      v = v - mean[c];
    }
    if (scaled) v = v * scale;
    out[index] = v;
  }
}

extern "C" __global__ void ce_transform_uint8""" + _PARAMS.format(T="unsigned char") + r""" {
  ce_transform_body<unsigned char>(count, batch, out, params, mean, mean_kind, scaled, scale,
                                   channels, height, width, out_h, out_w);
}

extern "C" __global__ void ce_transform_float""" + _PARAMS.format(T="float") + r""" {
  ce_transform_body<float>(count, batch, out, params, mean, mean_kind, scaled, scale,
                           channels, height, width, out_h, out_w);
}
"""

SOURCE = Source("transform", _CODE, ("ce_transform_uint8", "ce_transform_float"))


def _check_params(params, n, height, width, out_h, out_w):
    """Refuse host-held ``params`` whose crop window leaves the record."""
    if params.shape != (n, 3):
        raise ValueError(f"transform: params must have shape ({n}, 3), got {params.shape}")
    h_off, w_off = params[:, 1], params[:, 2]
    if n and (h_off.min() < 0 or w_off.min() < 0 or h_off.max() + out_h > height
              or w_off.max() + out_w > width):
        raise ValueError(f"transform: a crop window of {out_h}x{out_w} at the offsets "
                         f"{params[:, 1:].tolist()} leaves the {height}x{width} records")


def transform(device, batch, out, params, mean, scale):
    """Write the transformed ``batch`` into ``out`` on ``device`` (one kernel launch).

    Args:
        batch: (N, C, H, W) uint8 or float32 records, on the device or on the host (copied to
            the device; keep them uint8, a quarter of the float32 bytes). Other dtypes are
            converted to float32 first, as the reference's arithmetic does.
        out: (N, C, OH, OW) float32 array on the device (``OH`` x ``OW`` the crop, or H x W);
            one of another array module is filled by the reference function instead.
        params: integer (N, 3) ``[mirror, h_off, w_off]`` per image, host or device.
        mean: None, a (C, H, W) mean file or (C, 1, 1) mean values (anything broadcasting to
            those: (1, H, W), (1, 1, 1)), host or device, converted to float32.
        scale: the factor applied after the mean (1: not applied).

    Raises:
        ValueError: shapes that do not fit (``batch`` not 4-D, ``out`` not (N, C, OH, OW) with
            OH <= H and OW <= W, a mean that does not broadcast), or, when ``params`` is a host
            array, a wrong shape or a crop window leaving the record (a device-held ``params``
            is not checked: that would wait for the device).
    """
    xp = device.xp
    if get_array_module(out) is not xp:
        reference.transform(batch, out, params, mean, scale)
        return
    if batch.ndim != 4 or out.ndim != 4:
        raise ValueError(f"transform: batch and out must be 4-D, got {batch.shape} and "
                         f"{out.shape}")
    n, c, height, width = batch.shape
    out_h, out_w = out.shape[2:]
    if tuple(out.shape[:2]) != (n, c) or out_h > height or out_w > width:
        raise ValueError(f"transform: out of shape {out.shape} does not fit records of shape "
                         f"{batch.shape}")
    if isinstance(params, numpy.ndarray):
        _check_params(params, n, height, width, out_h, out_w)
        params = numpy.ascontiguousarray(params, dtype=numpy.int32)
    params = xp.ascontiguousarray(xp.asarray(params), dtype=xp.int32)
    batch = xp.asarray(batch)
    if batch.dtype == numpy.uint8:
        kernel = "ce_transform_uint8"
        batch = xp.ascontiguousarray(batch)
    else:
        kernel = "ce_transform_float"
        batch = xp.ascontiguousarray(batch, dtype=f32)
    if mean is None:
        kind, mean = 0, params  # never read
    else:
        mean = xp.asarray(mean, dtype=f32)
        if mean.ndim == 3 and mean.shape[1:] == (1, 1):
            kind, shape = 1, (c, 1, 1)
        else:
            kind, shape = 2, (c, height, width)
        mean = xp.ascontiguousarray(xp.broadcast_to(mean, shape))
    target = out if out.dtype == f32 and out.flags.c_contiguous else xp.empty(out.shape, f32)
    count = target.size
    device.launch(SOURCE, kernel, count, int32(count), batch, target, params, mean,
                  int32(kind), int32(scale != 1), float32(scale), int32(c), int32(height),
                  int32(width), int32(out_h), int32(out_w))
    if target is not out:
        out[...] = target
