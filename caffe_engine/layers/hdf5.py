"""HDF5 layers: HDF5Data reads rows of datasets from a list of .h5 files, HDF5Output writes blobs.

Caffe: src/caffe/layers/hdf5_data_layer.cpp, src/caffe/layers/hdf5_output_layer.cpp,
src/caffe/util/hdf5.cpp.

Shuffling. Caffe's HDF5Data shuffles with ``std::random_shuffle``, which draws from the C
library's ``rand()``: *not* Caffe's mt19937 stream, so ``random_seed`` does not govern it, and
the sequence is that of glibc's ``rand()`` with its default seed 1 (Caffe never calls
``srand``). :class:`CRand` reproduces glibc's generator and libstdc++'s ``random_shuffle``, with one
process-wide instance (:func:`c_rand`), so a shuffled HDF5Data visits rows in the order Caffe
(on glibc / libstdc++) would in a fresh process. :func:`c_srand` reseeds it (C's ``srand``).
"""
import logging

import numpy

from ..backend import get_array_module, to_numpy
from ..errors import CaffeError
from ..proto import caffe_pb2
from .base import Layer, register

logger = logging.getLogger("caffe_engine")

#: Dataset names HDF5Output writes (Caffe's HDF5_DATA_DATASET_NAME / HDF5_DATA_LABEL_NAME).
HDF5_DATA_DATASET_NAME = "data"
HDF5_DATA_LABEL_NAME = "label"


def _h5py():
    try:
        import h5py
    except ImportError:  # pragma: no cover - h5py is a dependency
        raise CaffeError("the HDF5 layers need the h5py package (pip install h5py)") from None
    return h5py


# ------------------------------------------------------------------------------------------------
# glibc rand() and libstdc++ std::random_shuffle
# ------------------------------------------------------------------------------------------------
class CRand:
    """glibc's ``rand()`` (the TYPE_3 additive feedback generator behind ``random()``).

    Args:
        seed: as for ``srand`` (default 1, the seed a C program starts with).
    """

    def __init__(self, seed=1):
        self.seed(seed)

    def seed(self, seed):
        """``srand(seed)``: 31 words from a Lehmer generator, then 310 outputs discarded."""
        seed = int(seed) & 0xFFFFFFFF
        if seed == 0:
            seed = 1  # glibc: seed 0 behaves as 1
        r = [0] * 34
        r[0] = seed if seed < 2 ** 31 else seed - 2 ** 32  # int32_t
        for i in range(1, 31):
            # 16807 * r[i-1] % 2147483647 by Schrage's method, in signed 32-bit arithmetic.
            hi, lo = divmod(r[i - 1], 127773) if r[i - 1] >= 0 else (-(-r[i - 1] // 127773),
                                                                    -(-r[i - 1] % 127773))
            word = 16807 * lo - 2836 * hi
            if word < 0:
                word += 2147483647
            r[i] = word
        for i in range(31, 34):
            r[i] = r[i - 31]
        self._state = [x & 0xFFFFFFFF for x in r]
        for _ in range(310):
            self._next_word()

    def _next_word(self):
        s = self._state
        word = (s[-31] + s[-3]) & 0xFFFFFFFF
        s.append(word)
        del s[0]
        return word

    def rand(self):
        """The next ``rand()`` value, in [0, 2**31)."""
        return self._next_word() >> 1

    def random_shuffle(self, items):
        """libstdc++'s ``std::random_shuffle(first, last)``, in place on a list."""
        for i in range(1, len(items)):
            j = self.rand() % (i + 1)
            if i != j:
                items[i], items[j] = items[j], items[i]


_C_RAND = {"rng": CRand(1)}


def c_rand():
    """The process-wide C ``rand()`` stream used by HDF5Data's shuffling."""
    return _C_RAND["rng"]


def c_srand(seed=1):
    """Reseed the process-wide C ``rand()`` stream (C's ``srand``); 1 is a fresh process."""
    _C_RAND["rng"] = CRand(seed)


# ------------------------------------------------------------------------------------------------
# HDF5Data
# ------------------------------------------------------------------------------------------------
@register("HDF5Data")
class HDF5DataLayer(Layer):
    """Rows of the datasets named by the tops, from .h5 files listed in a text file.

    Tops: one per dataset, named as the dataset; top ``j`` is (batch_size, d1, ..., dk) float32
    for a dataset of shape (rows, d1, ..., dk) (any number of axes >= 1). All the datasets of a
    file must have the same number of rows. Every file is read whole when it is reached; numeric
    datasets of any type are converted to float32.

    Order: the files in list order, the rows of each in order; after the last row of a file the
    next file is loaded, after the last file the first again. A batch spans files as needed.
    With ``shuffle`` the file order is shuffled at setup and at each pass over the list, and the
    row order each time a file is loaded and again each time its rows are exhausted (Caffe's
    exact sequence of ``std::random_shuffle`` calls, drawing from :func:`c_rand`).

    Fields read (hdf5_data_param): source (a text file of whitespace-separated .h5 paths,
    relative to the working directory), batch_size (required, > 0), shuffle (false).

    Attributes:
        solver_count, solver_rank: with several solvers each TRAIN instance keeps the rows whose
            running offset ``% solver_count == solver_rank`` (Caffe's ``Skip``); default 1, 0.

    Raises:
        CaffeError naming the layer: a transform_param is given (Caffe: "does not transform
        data"); the source cannot be read or lists no file; a file cannot be opened, lacks a
        dataset, has a dataset that is not numeric or has no axes, has datasets with different
        row counts, or has row shapes different from the first file's.

    Caffe: src/caffe/layers/hdf5_data_layer.cpp.
    """

    exact_num_bottom = 0
    min_top = 1

    def layer_setup(self, bottom, top):
        if self.param.HasField("transform_param"):
            raise self.error("HDF5Data does not transform data (remove transform_param)")
        hp = self.param.hdf5_data_param
        self.batch_size = int(hp.batch_size)
        if self.batch_size <= 0:
            raise self.error("hdf5_data_param.batch_size must be positive")
        self.shuffle = bool(hp.shuffle)
        self.solver_count = 1
        self.solver_rank = 0
        self.offset = 0
        logger.info("Loading list of HDF5 filenames from: %s", hp.source)
        try:
            with open(hp.source) as f:
                self.filenames = f.read().split()
        except OSError as exc:
            raise self.error(f"failed to open source file '{hp.source}': {exc.strerror}") from None
        logger.info("Number of HDF5 files: %d", len(self.filenames))
        if not self.filenames:
            raise self.error(f"must have at least 1 HDF5 filename listed in '{hp.source}'")
        self.file_permutation = list(range(len(self.filenames)))
        if self.shuffle:
            c_rand().random_shuffle(self.file_permutation)
        self.current_file = 0
        self._row_shapes = None
        self._load_file(self.filenames[self.file_permutation[0]])
        self.current_row = 0
        for t, blob in zip(top, self.hdf_blobs):
            t.reshape((self.batch_size,) + blob.shape[1:])

    def _load_file(self, filename):
        """Read every top's dataset from ``filename`` (Caffe's LoadHDF5FileData)."""
        h5py = _h5py()
        try:
            f = h5py.File(filename, "r")
        except OSError as exc:
            raise self.error(f"failed opening HDF5 file '{filename}': {exc}") from None
        blobs = []
        with f:
            for name in self.param.top:
                if name not in f or not isinstance(f[name], h5py.Dataset):
                    raise self.error(f"HDF5 file '{filename}' has no dataset '{name}'")
                ds = f[name]
                if ds.dtype.kind not in "fiub":
                    raise self.error(f"dataset '{name}' of '{filename}' has unsupported type "
                                     f"{ds.dtype} (numeric data only)")
                if ds.ndim < 1:
                    raise self.error(f"dataset '{name}' of '{filename}' must have at least 1 axis")
                blobs.append(numpy.ascontiguousarray(ds[()], dtype=numpy.float32))
        rows = blobs[0].shape[0]
        for name, b in zip(self.param.top, blobs):
            if b.shape[0] != rows:
                raise self.error(f"datasets of '{filename}' differ in rows: '{self.param.top[0]}' "
                                 f"has {rows}, '{name}' has {b.shape[0]}")
        shapes = [b.shape[1:] for b in blobs]
        if self._row_shapes is not None and shapes != self._row_shapes:
            raise self.error(f"the rows of '{filename}' have shapes {shapes}, those of the first "
                             f"file {self._row_shapes}")
        if rows == 0:
            raise self.error(f"the datasets of '{filename}' have no rows")
        self._row_shapes = shapes
        self.hdf_blobs = blobs
        self.data_permutation = list(range(rows))
        if self.shuffle:
            c_rand().random_shuffle(self.data_permutation)
        logger.debug("Successfully loaded %d rows%s", rows, " (shuffled)" if self.shuffle else "")

    def _skip(self):
        keep = (self.offset % self.solver_count == self.solver_rank
                or self.phase == caffe_pb2.TEST)
        return not keep

    def _next(self):
        """Advance one row, loading the next file and reshuffling as Caffe's ``Next``."""
        self.current_row += 1
        if self.current_row == self.hdf_blobs[0].shape[0]:
            if len(self.filenames) > 1:
                self.current_file += 1
                if self.current_file == len(self.filenames):
                    self.current_file = 0
                    if self.shuffle:
                        c_rand().random_shuffle(self.file_permutation)
                    logger.debug("Looping around to first file.")
                self._load_file(self.filenames[self.file_permutation[self.current_file]])
            self.current_row = 0
            if self.shuffle:
                c_rand().random_shuffle(self.data_permutation)
        self.offset += 1

    def reshape(self, bottom, top):
        """Nothing: the tops keep the shapes set at setup (Caffe's Reshape is empty)."""

    # -- exact resume (see solvers/snapshot.py) --------------------------------------------------
    def resume_state(self):
        """The read position (file, row, permutations and, when shuffling, the C stream)."""
        state = {"current_file": self.current_file, "current_row": self.current_row,
                 "offset": self.offset, "file_permutation": list(self.file_permutation),
                 "data_permutation": list(self.data_permutation)}
        if self.shuffle:
            state["c_rand"] = list(c_rand()._state)
        return state

    def restore_resume_state(self, state):
        """Continue from a :meth:`resume_state` snapshot."""
        self.file_permutation = list(state["file_permutation"])
        self.current_file = int(state["current_file"])
        shuffle, self.shuffle = self.shuffle, False   # reload without drawing
        try:
            self._load_file(self.filenames[self.file_permutation[self.current_file]])
        finally:
            self.shuffle = shuffle
        self.data_permutation = list(state["data_permutation"])
        self.current_row = int(state["current_row"])
        self.offset = int(state["offset"])
        if "c_rand" in state:
            c_rand()._state = [int(v) for v in state["c_rand"]]

    def forward(self, bottom, top):
        rows = []
        for _ in range(self.batch_size):
            while self._skip():
                self._next()
            rows.append((self.hdf_blobs, self.data_permutation[self.current_row]))
            self._next()
        xp = get_array_module(top[0].data)
        for j, t in enumerate(top):
            batch = numpy.stack([blobs[j][r] for blobs, r in rows])
            t.data[...] = xp.asarray(batch)


# ------------------------------------------------------------------------------------------------
# HDF5Output
# ------------------------------------------------------------------------------------------------
@register("HDF5Output")
class HDF5OutputLayer(Layer):
    """Writes its two bottoms to datasets ``data`` and ``label`` of an HDF5 file.

    Bottoms: ``data`` (N, ...) and ``label`` (N, ...) with the same N; no tops. Each is saved as
    a float32 4-D dataset (N, C, H, W): Caffe copies it through a legacy 4-D blob, so axes
    missing from a bottom of fewer than 4 axes are written as 1 (a (N,) label becomes
    (N, 1, 1, 1)); a bottom of more than 4 axes is refused, as in Caffe.

    The file is created (truncated) at setup. Caffe writes both datasets on every forward into
    that one file, so a second forward fails because the datasets exist: the same happens here,
    as a CaffeError.

    Fields read (hdf5_output_param): file_name (required).

    Raises:
        CaffeError naming the layer: no file_name, the file cannot be created; N differs between
        the bottoms; a bottom has more than 4 axes; a second forward.

    Caffe: src/caffe/layers/hdf5_output_layer.cpp.
    """

    exact_num_bottom = 2
    exact_num_top = 0

    def layer_setup(self, bottom, top):
        self.file_name = self.param.hdf5_output_param.file_name
        if not self.file_name:
            raise self.error("hdf5_output_param.file_name is required")
        h5py = _h5py()
        try:
            h5py.File(self.file_name, "w").close()
        except OSError as exc:
            raise self.error(f"failed to open HDF5 file '{self.file_name}': {exc}") from None
        self.saved = False

    def reshape(self, bottom, top):
        pass

    def _legacy_4d(self, blob, what):
        shape = blob.shape
        if len(shape) > 4:
            raise self.error(f"bottom '{what}' has {len(shape)} axes; HDF5Output saves at most 4")
        return tuple(shape) + (1,) * (4 - len(shape))

    def forward(self, bottom, top):
        data, label = bottom
        if data.shape[0] != label.shape[0]:
            raise self.error(f"data blob and label blob must have the same batch size "
                             f"({data.shape[0]} vs. {label.shape[0]})")
        data_shape = self._legacy_4d(data, "data")
        label_shape = self._legacy_4d(label, "label")
        logger.info("Saving HDF5 file %s", self.file_name)
        h5py = _h5py()
        with h5py.File(self.file_name, "a") as f:
            for name, blob, shape in ((HDF5_DATA_DATASET_NAME, data, data_shape),
                                      (HDF5_DATA_LABEL_NAME, label, label_shape)):
                if name in f:
                    raise self.error(f"failed to make float dataset '{name}' in "
                                     f"'{self.file_name}': it exists (Caffe writes once per file)")
                values = to_numpy(blob.data).reshape(shape).astype(numpy.float32)
                f.create_dataset(name, data=values)
        logger.info("Successfully saved %d rows", data.shape[0])
        self.saved = True

    def backward(self, top, propagate_down, bottom):
        """Nothing (Caffe's Backward_cpu returns at once)."""

