"""DummyData: tops filled by fillers, for nets that need data of a given shape and nothing more.

Caffe: src/caffe/layers/dummy_data_layer.cpp.
"""
from .. import fillers
from ..proto import caffe_pb2
from .base import Layer, register


@register("DummyData")
class DummyDataLayer(Layer):
    """Tops of fixed shapes filled by ``data_filler``; no bottoms, no gradient.

    Shapes: each top takes ``shape`` (one for every top, or one per top), or the legacy 4-D
    ``(num, channels, height, width)`` where each of the four is given once or once per top.
    float32.

    Fillers: none (every top constant 0), one for every top, or one per top. As in Caffe, a
    ``constant`` filler fills its top(s) once, at setup, and never again; any other filler draws
    from the global random stream on every forward (and not at setup), top by top in order.

    Fields read (dummy_data_param): data_filler (repeated FillerParameter), shape (repeated
    BlobShape), num / channels / height / width (repeated uint32, legacy).

    Raises:
        CaffeError naming the layer: the number of fillers is not 0, 1 or the number of tops;
        both ``shape`` and legacy dims given; a shape or legacy dim given neither once nor once
        per top; an unknown filler type.

    Caffe: src/caffe/layers/dummy_data_layer.cpp.
    """

    exact_num_bottom = 0
    min_top = 1

    def layer_setup(self, bottom, top):
        param = self.param.dummy_data_param
        num_top = len(top)
        nfill = len(param.data_filler)
        if nfill not in (0, 1, num_top):
            raise self.error(f"number of data fillers must be 0, 1 or equal to the number of tops: "
                             f"{num_top}; you specified {nfill} data fillers")
        legacy = [param.num, param.channels, param.height, param.width]
        if any(len(field) for field in legacy):
            if len(param.shape):
                raise self.error("both shape and legacy fields (num, channels, height, width) "
                                 "were specified")
            for name, field in zip(("num", "channels", "height", "width"), legacy):
                if len(field) not in (1, num_top):
                    raise self.error(f"must specify '{name}' once, or once per top blob "
                                     f"({num_top}); specified {len(field)}")
            shapes = [tuple(int(f[0] if len(f) == 1 else f[i]) for f in legacy)
                      for i in range(num_top)]
        else:
            if len(param.shape) not in (1, num_top):
                raise self.error(f"must specify 'shape' once, or once per top blob ({num_top}); "
                                 f"specified {len(param.shape)}")
            shapes = [tuple(int(d) for d in param.shape[0 if len(param.shape) == 1 else i].dim)
                      for i in range(num_top)]

        if nfill == 0:
            default = caffe_pb2.FillerParameter(type="constant", value=0)
            self.fillers = [default]
        else:
            self.fillers = list(param.data_filler)
        for filler in self.fillers:
            if filler.type not in fillers.FILLERS:
                raise self.error(f"unknown filler type '{filler.type}' "
                                 f"(known: {', '.join(sorted(fillers.FILLERS))})")
        # Caffe's refill_: constant fillers fill once here; the others on every forward.
        self.refill = [f.type != "constant" for f in self.fillers]
        for i, t in enumerate(top):
            t.reshape(shapes[i])
        for i, t in enumerate(top):
            k = i if len(self.fillers) > 1 else 0
            if not self.refill[k]:
                fillers.fill(t, self.fillers[k])

    def reshape(self, bottom, top):
        """Nothing: the tops keep the shapes set at setup (Caffe's Reshape is empty)."""

    def forward(self, bottom, top):
        for i, t in enumerate(top):
            k = i if len(self.fillers) > 1 else 0
            if self.refill[k]:
                fillers.fill(t, self.fillers[k])
