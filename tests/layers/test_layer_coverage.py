"""Every registered layer type is exercised: by Caffe's golden cases or by a test of its own."""
import golden
from caffe_engine.layers import layer_type_list
from paths import TESTS


def test_every_registered_type_has_golden_or_own_tests():
    golden_types = {t for c in golden.manifest()["cases"] for t in c["layer_type"].split("+")}
    # Every test module of every folder (tests/layers/, tests/io/, ..., tests/ itself).
    own = "".join(p.read_text() for p in sorted(TESTS.rglob("test_*.py"))
                  if p.name != "test_layer_coverage.py")
    missing = [t for t in layer_type_list() if t not in golden_types and f'"{t}"' not in own]
    assert not missing, f"layer types without tests: {missing}"


def test_every_caffe_layer_type_is_registered():
    caffe_types = {
        "AbsVal", "Accuracy", "ArgMax", "BNLL", "BatchNorm", "BatchReindex", "Bias", "Clip", "Concat",
        "ContrastiveLoss", "Convolution", "Crop", "Data", "Deconvolution", "Dropout", "DummyData", "ELU",
        "Eltwise", "Embed", "EuclideanLoss", "Exp", "Filter", "Flatten", "HDF5Data", "HDF5Output",
        "HingeLoss", "Im2col", "ImageData", "InfogainLoss", "InnerProduct", "Input", "LRN", "LSTM",
        "LSTMUnit", "Log", "MVN", "MemoryData", "MultinomialLogisticLoss", "PReLU", "Parameter",
        "Pooling", "Power", "Python", "RNN", "ReLU", "Reduction", "Reshape", "SPP", "Scale", "Sigmoid",
        "SigmoidCrossEntropyLoss", "Silence", "Slice", "Softmax", "SoftmaxWithLoss", "Split", "Swish",
        "TanH", "Threshold", "Tile", "WindowData"}
    assert caffe_types <= set(layer_type_list())
