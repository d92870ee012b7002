"""Windowed detection: a deploy net classifying crops of images (pycaffe's ``caffe.Detector``).

Caffe: python/caffe/detector.py, after R-CNN (Girshick et al., arXiv:1311.2524): each window
is cut from its image, optionally with a border of context around it (``context_pad`` pixels
of the net's input are context, the rest of the border filled with the mean), warped to the
net's input size and classified.
"""
import os

import numpy

from . import io as caffe_io
from .errors import CaffeError
from .net import TEST, Net
from .pycaffe import input_transformer


class Detector(Net):
    """A deploy net with its preprocessing, scoring image windows (pycaffe's Detector).

    Args:
        model_file: deploy prototxt (one input of shape (N, K, H, W), square H = W when
            ``context_pad`` is used).
        pretrained_file: ``.caffemodel`` with its weights.
        mean, input_scale, raw_scale, channel_swap: as the Transformer's setters.
        context_pad: pixels of the net input's border taken from around the window (R-CNN's
            context padding); None or 0 crops the window alone.

    Attributes:
        transformer: the :class:`caffe_engine.io.Transformer` of the input (transpose (2, 0, 1)).
        crop_dims: (H, W, K) of a window after warping; crop_mean: the mean in image space
            (H, W, K) that fills context beyond the image.
    """

    def __init__(self, model_file, pretrained_file, mean=None, input_scale=None, raw_scale=None,
                 channel_swap=None, context_pad=None):
        super().__init__(model_file, TEST, weights=pretrained_file)
        self.transformer = input_transformer(self, mean, input_scale, raw_scale, channel_swap)
        self.configure_crop(context_pad)

    def detect_windows(self, images_windows):
        """Score every window of every image.

        Args:
            images_windows: iterable of (image filename, windows); a window is
                (ymin, xmin, ymax, xmax) in pixels, as an array or a sequence of ints.

        Returns:
            list of dicts ``{'window', 'prediction', 'filename'}``, one per window in input
            order; ``prediction`` is the first output blob's row for that window.

        Raises:
            CaffeError: an image cannot be read; no windows at all.
        """
        images_windows = [(name, list(windows)) for name, windows in images_windows]
        crops = []
        for name, windows in images_windows:
            image = caffe_io.load_image(name).astype(numpy.float32)
            crops.extend(self.crop(image, window) for window in windows)
        if not crops:
            raise CaffeError("detect_windows: no windows given")
        in_ = self.inputs[0]
        batch = numpy.zeros((len(crops), crops[0].shape[2]) + tuple(self.blobs[in_].data.shape[2:]),
                            numpy.float32)
        for i, window_crop in enumerate(crops):
            batch[i] = self.transformer.preprocess(in_, window_crop)
        predictions = self.forward_all(**{in_: batch})[self.outputs[0]]
        detections, i = [], 0
        for name, windows in images_windows:
            for window in windows:
                detections.append({"window": window, "prediction": predictions[i], "filename": name})
                i += 1
        return detections

    def detect_selective_search(self, image_fnames):
        """Score the Selective Search proposals of each image (needs the external
        ``selective_search_ijcv_with_python`` module and its MATLAB code, as pycaffe does).

        Raises:
            CaffeError: the module is not installed.
        """
        try:
            import selective_search_ijcv_with_python as selective_search
        except ImportError:
            raise CaffeError("detect_selective_search needs selective_search_ijcv_with_python "
                             "(github.com/sergeyk/selective_search_ijcv_with_python) on the "
                             "Python path") from None
        image_fnames = [os.path.abspath(f) for f in image_fnames]
        windows = selective_search.get_windows(image_fnames, cmd="selective_search_rcnn")
        return self.detect_windows(zip(image_fnames, windows))

    def crop(self, im, window):
        """The window of image ``im`` (H, W, K) to warp, with context when configured.

        Without context this is ``im[ymin:ymax, xmin:xmax]``. With ``context_pad`` the box is
        grown about its centre so that, once warped to the input size, ``context_pad`` pixels
        of each side are context; what falls outside the image is left as ``crop_mean``.

        Returns:
            float array (h, w, K): the bare window, or (H, W, K) with context.
        """
        window = numpy.asarray(window)
        if not self.context_pad:
            return im[window[0]:window[2], window[1]:window[3]]
        size = self.blobs[self.inputs[0]].width         # a square input, as pycaffe assumes
        scale = size / (1.0 * size - self.context_pad * 2)
        half_h = (window[2] - window[0] + 1) / 2.0
        half_w = (window[3] - window[1] + 1) / 2.0
        centre = (window[0] + half_h, window[1] + half_w)
        box = numpy.round(numpy.tile(centre, 2) + scale * numpy.array((-half_h, -half_w,
                                                                       half_h, half_w)))
        scale_h = size / (box[2] - box[0] + 1)
        scale_w = size / (box[3] - box[1] + 1)
        pad_y = round(max(0, -box[0]) * scale_h)     # rows of the input beyond the image
        pad_x = round(max(0, -box[1]) * scale_w)
        im_h, im_w = im.shape[:2]
        box = numpy.clip(box, 0.0, [im_h, im_w, im_h, im_w])
        clip_h, clip_w = box[2] - box[0] + 1, box[3] - box[1] + 1
        if clip_h <= 0 or clip_w <= 0:
            raise CaffeError(f"window {window.tolist()} lies outside the {im_h}x{im_w} image")
        crop_h = min(round(clip_h * scale_h), size - pad_y)
        crop_w = min(round(clip_w * scale_w), size - pad_x)
        box = box.astype(int)
        context = caffe_io.resize_image(im[box[0]:box[2], box[1]:box[3]], (crop_h, crop_w))
        out = numpy.ones(self.crop_dims, numpy.float32) * self.crop_mean
        out[pad_y:pad_y + crop_h, pad_x:pad_x + crop_w] = context
        return out

    def configure_crop(self, context_pad):
        """Set ``crop_dims`` and ``context_pad``; with context, ``crop_mean``: the
        transformer's mean taken back to image space (untransposed, channels unswapped, divided
        by ``raw_scale``), or zeros without a mean."""
        in_ = self.inputs[0]
        transpose = self.transformer.transpose[in_]
        inverse = [transpose[t] for t in transpose]
        self.crop_dims = numpy.array(self.blobs[in_].data.shape[1:])[inverse]
        self.context_pad = context_pad
        if not context_pad:
            return
        mean = self.transformer.mean.get(in_)
        if mean is None:
            self.crop_mean = numpy.zeros(self.crop_dims, numpy.float32)
            return
        crop_mean = numpy.array(mean, numpy.float32).transpose(inverse)
        order = self.transformer.channel_swap.get(in_)
        if order is not None:
            crop_mean = crop_mean[:, :, [list(order).index(i) for i in range(crop_mean.shape[2])]]
        raw_scale = self.transformer.raw_scale.get(in_)
        if raw_scale is not None:
            crop_mean /= raw_scale
        self.crop_mean = crop_mean
