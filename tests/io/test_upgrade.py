"""Legacy net and solver syntax is upgraded as Caffe's upgrade_proto.cpp does, and the three
upgrade tools behave as Caffe's (input, output; --help; one-line errors, exit 1).

The real-world files' upgrades are also checked, log line by log line, against Caffe's own log
in tests/test_model_zoo.py (test_upgrade_log_matches_caffe).
"""
import subprocess
import sys

import numpy
import pytest
from google.protobuf import text_format

from caffe_engine.errors import CaffeError
from caffe_engine.io import prototxt as pio
from caffe_engine.io import upgrade
from caffe_engine.io.blobproto import proto_to_array
from caffe_engine.net import Net
from caffe_engine.tools import upgrade_proto
from caffe_engine.proto import caffe_pb2
from paths import ROOT, SHARED

REALWORLD = SHARED / "realworld"
TOOLS = ROOT / "tools"
V1 = caffe_pb2.V1LayerParameter


def net(text):
    return text_format.Parse(text, caffe_pb2.NetParameter())


def upgraded(text, path="net.prototxt"):
    notes = []
    param = net(text)
    ok = upgrade.upgrade_net_as_needed(param, path, notes)
    return param, ok, notes


# ------------------------------------------------------------------------------------------------
# V0 -> V1 -> V2
# ------------------------------------------------------------------------------------------------
V0_NET = """
name: "v0net"
input: "data"
input_dim: 2 input_dim: 3 input_dim: 9 input_dim: 9
layers { layer { name: "pad1" type: "padding" pad: 2 } bottom: "data" top: "pad1" }
layers { layer { name: "conv1" type: "conv" num_output: 4 kernelsize: 3 stride: 2 group: 1
                 biasterm: true weight_filler { type: "gaussian" std: 0.01 }
                 blobs_lr: 1 blobs_lr: 2 weight_decay: 1 weight_decay: 0 }
         bottom: "pad1" top: "conv1" }
layers { layer { name: "relu1" type: "relu" } bottom: "conv1" top: "conv1" }
layers { layer { name: "pad2" type: "padding" pad: 1 } bottom: "conv1" top: "pad2" }
layers { layer { name: "pool1" type: "pool" pool: AVE kernelsize: 3 stride: 2 }
         bottom: "pad2" top: "pool1" }
layers { layer { name: "norm1" type: "lrn" local_size: 3 alpha: 0.001 beta: 0.5 k: 2 }
         bottom: "pool1" top: "norm1" }
layers { layer { name: "drop1" type: "dropout" dropout_ratio: 0.25 } bottom: "norm1" top: "norm1" }
layers { layer { name: "ip1" type: "innerproduct" num_output: 5
                 bias_filler { type: "constant" value: 0.5 } }
         bottom: "norm1" top: "ip1" }
layers { layer { name: "prob" type: "softmax" } bottom: "ip1" top: "prob" }
"""


def test_v0_padding_layers_fold_into_conv_and_pool():
    param, ok, notes = upgraded(V0_NET)
    assert ok
    assert [lp.name for lp in param.layer] == ["input", "conv1", "relu1", "pool1", "norm1",
                                               "drop1", "ip1", "prob"]
    conv, pool = param.layer[1], param.layer[3]
    assert list(conv.bottom) == ["data"] and list(conv.convolution_param.pad) == [2]
    assert list(pool.bottom) == ["conv1"] and pool.pooling_param.pad == 1
    assert notes[0] == ("Attempting to upgrade input file specified using deprecated "
                        "V0LayerParameter: net.prototxt")
    assert "Successfully upgraded file specified using deprecated V0LayerParameter" in notes
    assert any(n.startswith("Note that future Caffe releases will not support V0NetParameter")
               for n in notes)


def test_v0_fields_move_into_their_params():
    param, _, _ = upgraded(V0_NET)
    layers = {lp.name: lp for lp in param.layer}
    assert [lp.type for lp in param.layer] == ["Input", "Convolution", "ReLU", "Pooling", "LRN",
                                               "Dropout", "InnerProduct", "Softmax"]
    cp = layers["conv1"].convolution_param
    assert (cp.num_output, list(cp.kernel_size), list(cp.stride), cp.group, cp.bias_term) == \
        (4, [3], [2], 1, True)
    assert cp.HasField("bias_term") and cp.HasField("group")
    assert cp.weight_filler.type == "gaussian" and cp.weight_filler.std == pytest.approx(0.01)
    assert [(p.lr_mult, p.decay_mult) for p in layers["conv1"].param] == [(1, 1), (2, 0)]
    pp = layers["pool1"].pooling_param
    assert (pp.pool, pp.kernel_size, pp.stride) == (caffe_pb2.PoolingParameter.AVE, 3, 2)
    lrn = layers["norm1"].lrn_param
    assert (lrn.local_size, lrn.alpha, lrn.beta, lrn.k) == \
        (3, pytest.approx(0.001), 0.5, 2)
    assert layers["drop1"].dropout_param.dropout_ratio == 0.25
    ip = layers["ip1"].inner_product_param
    assert ip.num_output == 5 and ip.bias_filler.value == 0.5
    assert list(layers["input"].input_param.shape[0].dim) == [2, 3, 9, 9]


def test_v0_net_builds_and_runs():
    param, _, _ = upgraded(V0_NET)
    built = Net(param, caffe_pb2.TEST)
    # 9x9 padded by 2 -> 13, conv 3 stride 2 -> 6; padded by 1 -> 8, pool 3 stride 2 -> 4
    # (Caffe's ceil: (8 - 3) / 2 + 1 = 3.5 -> 4).
    assert built.blobs["conv1"].shape == (2, 4, 6, 6)
    assert built.blobs["pool1"].shape == (2, 4, 4, 4)
    out = built.forward(data=numpy.ones((2, 3, 9, 9), numpy.float32))
    numpy.testing.assert_allclose(out["prob"].sum(axis=1), 1, rtol=1e-5)


def test_v0_data_layer_fields():
    param, ok, _ = upgraded("""
        layers { layer { name: "d" type: "data" source: "db" batchsize: 7 meanfile: "m.binaryproto"
                         cropsize: 5 mirror: true scale: 0.5 rand_skip: 3 }
                 top: "data" top: "label" }
        layers { layer { name: "i" type: "images" source: "list.txt" batchsize: 2
                         shuffle_images: true new_height: 10 new_width: 12 } top: "x" top: "y" }
        layers { layer { name: "w" type: "window_data" source: "w.txt" det_fg_threshold: 0.6
                         det_context_pad: 4 det_crop_mode: "square" } top: "p" top: "q" }
        layers { layer { name: "c" type: "concat" concat_dim: 0 } bottom: "x" bottom: "x" top: "z" }
    """)
    assert ok
    d, i, w, c = param.layer
    assert (d.type, d.data_param.source, d.data_param.batch_size, d.data_param.rand_skip) == \
        ("Data", "db", 7, 3)
    t = d.transform_param
    assert (t.mean_file, t.crop_size, t.mirror, t.scale) == ("m.binaryproto", 5, True, 0.5)
    assert (i.type, i.image_data_param.shuffle, i.image_data_param.new_height,
            i.image_data_param.new_width, i.image_data_param.batch_size) == \
        ("ImageData", True, 10, 12, 2)
    assert (w.type, w.window_data_param.context_pad, w.window_data_param.crop_mode) == \
        ("WindowData", 4, "square")
    assert w.window_data_param.fg_threshold == pytest.approx(0.6)
    assert (c.type, c.concat_param.concat_dim) == ("Concat", 0)


def test_v0_misplaced_field_is_reported_and_upgrade_continues():
    param, ok, notes = upgraded('layers { layer { name: "r" type: "relu" num_output: 3 } '
                                'bottom: "a" top: "a" }\ninput: "a"')
    assert not ok
    assert "Unknown parameter num_output for layer type relu" in notes
    assert any(n.startswith("Warning: had one or more problems upgrading V0NetParameter")
               for n in notes)
    assert param.layer[0].type == "ReLU"


def test_v0_unknown_type_and_bad_padding_are_fatal():
    with pytest.raises(CaffeError, match="Unknown layer name: warp"):
        upgraded('layers { layer { name: "x" type: "warp" } }')
    with pytest.raises(CaffeError, match="Padding layer input to non-convolutional / "
                                         "non-pooling layer type relu"):
        upgraded("""input: "data"
            layers { layer { name: "p" type: "padding" pad: 1 } bottom: "data" top: "p" }
            layers { layer { name: "r" type: "relu" } bottom: "p" top: "r" }""")
    with pytest.raises(CaffeError, match="Unknown blob input nothing to layer 0"):
        upgraded('layers { layer { name: "r" type: "relu" } bottom: "nothing" top: "r" }')


def test_v1_type_map_covers_every_v1_type():
    enum = V1.LayerType.DESCRIPTOR.values_by_number
    assert set(upgrade.V1_TYPE_NAMES) == set(enum)
    assert upgrade.V1_TYPE_NAMES[V1.CONVOLUTION] == "Convolution"
    assert upgrade.V1_TYPE_NAMES[V1.SOFTMAX_LOSS] == "SoftmaxWithLoss"
    assert upgrade.V1_TYPE_NAMES[V1.IMAGE_DATA] == "ImageData"
    assert upgrade.V1_TYPE_NAMES[V1.TANH] == "TanH"
    assert upgrade.V1_TYPE_NAMES[V1.SIGMOID_CROSS_ENTROPY_LOSS] == "SigmoidCrossEntropyLoss"
    # Every upgraded name is a current Caffe type string (all but the legacy Im2col are ours
    # or listed in caffe.proto's LayerParameter comments).
    for number, name in upgrade.V1_TYPE_NAMES.items():
        if number != V1.NONE:
            assert name and name[0].isupper()


def test_v1_blobs_lr_weight_decay_names_share_modes_become_param_specs():
    param, ok, notes = upgraded("""
        name: "v1"
        layers { name: "conv" type: CONVOLUTION bottom: "data" top: "conv"
                 blobs_lr: 1 blobs_lr: 2 weight_decay: 1 weight_decay: 0
                 param: "shared_w" blob_share_mode: PERMISSIVE
                 convolution_param { num_output: 2 kernel_size: 1 }
                 include { phase: TRAIN } }
        layers { name: "loss" type: EUCLIDEAN_LOSS bottom: "conv" bottom: "conv" top: "loss"
                 loss_weight: 0.5 exclude { stage: "deploy" } }
        layers { name: "sig" type: SIGMOID bottom: "conv" top: "sig"
                 sigmoid_param { engine: CAFFE } }
    """)
    assert ok and not len(param.layers)
    conv, loss, sig = param.layer
    assert (conv.type, loss.type, sig.type) == ("Convolution", "EuclideanLoss", "Sigmoid")
    assert [(p.name, p.share_mode, p.lr_mult, p.decay_mult) for p in conv.param] == [
        ("shared_w", caffe_pb2.ParamSpec.PERMISSIVE, 1, 1), ("", caffe_pb2.ParamSpec.STRICT, 2, 0)]
    assert not conv.param[1].HasField("share_mode")
    assert conv.include[0].phase == caffe_pb2.TRAIN
    assert conv.convolution_param.num_output == 2
    assert list(loss.loss_weight) == [0.5] and loss.exclude[0].stage == ["deploy"]
    assert sig.sigmoid_param.engine == caffe_pb2.SigmoidParameter.CAFFE
    assert notes == ["Attempting to upgrade input file specified using deprecated "
                     "V1LayerParameter: net.prototxt",
                     "Successfully upgraded file specified using deprecated V1LayerParameter"]


def test_v1_lr_mults_reach_the_built_net():
    param, _, _ = upgraded("""
        input: "data" input_shape { dim: 1 dim: 2 dim: 3 dim: 3 }
        layers { name: "c1" type: CONVOLUTION bottom: "data" top: "c1" blobs_lr: 0.5 blobs_lr: 3
                 weight_decay: 2 weight_decay: 0
                 convolution_param { num_output: 2 kernel_size: 1 } }
        layers { name: "c2" type: CONVOLUTION bottom: "c1" top: "c2" blobs_lr: 0 blobs_lr: 0
                 convolution_param { num_output: 2 kernel_size: 1 } }
    """)
    built = Net(param, caffe_pb2.TRAIN)
    assert list(built.params_lr) == [0.5, 3, 0, 0]
    assert list(built.params_weight_decay) == [2, 0, 1, 1]


def test_v1_transformation_fields_move_to_transform_param():
    param, ok, notes = upgraded("""
        layers { name: "d" type: DATA top: "data" top: "label"
                 data_param { source: "db" batch_size: 4 scale: 0.25 mean_file: "mean" crop_size: 3
                              mirror: true } }
        layers { name: "i" type: IMAGE_DATA top: "x" top: "y"
                 image_data_param { source: "l" crop_size: 5 } }
        layers { name: "w" type: WINDOW_DATA top: "p" top: "q" window_data_param { mirror: true } }
    """)
    assert ok
    d, i, w = param.layer
    assert (d.transform_param.scale, d.transform_param.mean_file, d.transform_param.crop_size,
            d.transform_param.mirror) == (0.25, "mean", 3, True)
    for f in ("scale", "mean_file", "crop_size", "mirror"):
        assert not d.data_param.HasField(f)
    assert (d.data_param.source, d.data_param.batch_size) == ("db", 4)
    assert i.transform_param.crop_size == 5 and not i.image_data_param.HasField("crop_size")
    assert w.transform_param.mirror and not w.window_data_param.HasField("mirror")
    assert notes[:3] == [
        "Attempting to upgrade input file specified using deprecated transformation "
        "parameters: net.prototxt",
        "Successfully upgraded file specified using deprecated data transformation parameters.",
        "Note that future Caffe releases will only support transform_param messages for "
        "transformation fields."]


def test_new_format_data_param_fields_are_left_alone():
    # Caffe only upgrades transformation fields of V1 layers.
    param = net('layer { name: "d" type: "Data" top: "x" data_param { scale: 0.5 } }')
    assert not upgrade.net_needs_upgrade(param)
    upgrade.upgrade_net(param)
    assert param.layer[0].data_param.scale == 0.5 and not param.layer[0].HasField("transform_param")


MIXED = ('name: "mixed"\n'
         'layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 2 } } }\n'
         'layers { name: "old" type: RELU bottom: "data" top: "r" }\n')


def test_layer_and_layers_together_is_refused_in_one_line():
    # Caffe master's UpgradeV1Net: LOG(FATAL) "Refusing to upgrade inconsistent NetParameter
    # input; the definition includes both 'layer' and 'layers' fields. ..." (older Caffe dropped
    # the 'layer' entries and went on).
    with pytest.raises(CaffeError) as info:
        upgraded(MIXED, "mixed.prototxt")
    message = str(info.value)
    assert message.startswith("mixed.prototxt: Refusing to upgrade inconsistent NetParameter "
                              "input; the definition includes both 'layer' and 'layers' fields")
    assert "\n" not in message


def test_mixed_net_file_is_refused_by_net_and_the_cli(tmp_path):
    path = tmp_path / "mixed.prototxt"
    path.write_text(MIXED)
    with pytest.raises(CaffeError, match="mixed.prototxt: Refusing to upgrade inconsistent"):
        Net(str(path), caffe_pb2.TEST)
    r = subprocess.run([sys.executable, "-m", "caffe_engine", "time", "--model", str(path),
                        "--iterations", "1"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"{path}: Refusing to upgrade inconsistent" in r.stderr.strip().splitlines()[-1]


def test_v1_layer_holding_v0_layer_is_reported():
    v1 = V1(name="x", type=V1.RELU)
    v1.layer.name = "old"
    layer, ok = upgrade.upgrade_v1_layer(v1)
    assert not ok and layer.type == "ReLU"


# ------------------------------------------------------------------------------------------------
# Input fields, BatchNorm
# ------------------------------------------------------------------------------------------------
def test_input_fields_become_a_leading_input_layer():
    param, ok, notes = upgraded("""
        input: "a" input: "b"
        input_shape { dim: 2 dim: 3 } input_shape { dim: 2 }
        layer { name: "r" type: "ReLU" bottom: "a" top: "r" }""")
    assert ok and not len(param.input) and not len(param.input_shape)
    first = param.layer[0]
    assert (first.name, first.type, list(first.top)) == ("input", "Input", ["a", "b"])
    assert [list(s.dim) for s in first.input_param.shape] == [[2, 3], [2]]
    assert notes == ["Attempting to upgrade input file specified using deprecated input fields: "
                     "net.prototxt",
                     "Successfully upgraded file specified using deprecated input fields.",
                     "Note that future Caffe releases will only support input layers and not "
                     "input fields."]


def test_input_without_shape_is_dropped_as_for_old_caffemodels():
    param, _, _ = upgraded('input: "data" layer { name: "c" type: "ReLU" bottom: "data" top: "c" }')
    assert [lp.name for lp in param.layer] == ["c"] and not len(param.input)


def test_input_count_mismatch_is_an_error():
    with pytest.raises(CaffeError, match="2 input"):
        upgraded('input: "a" input: "b" input_dim: 1 input_dim: 2 input_dim: 3 input_dim: 4')
    with pytest.raises(CaffeError, match="input_shape"):
        upgraded('input: "a" input: "b" input_shape { dim: 1 }')


def test_batch_norm_with_three_param_specs_gets_zero_multipliers():
    param, ok, notes = upgraded("""
        layer { name: "bn" type: "BatchNorm" bottom: "x" top: "x"
                param { lr_mult: 1 name: "m" } param { lr_mult: 1 } param { decay_mult: 1 } }
        layer { name: "bn2" type: "BatchNorm" bottom: "x" top: "x" param { lr_mult: 1 } }""")
    assert ok
    bn, bn2 = param.layer
    assert [(p.name, p.lr_mult, p.decay_mult) for p in bn.param] == [("m", 0, 0), ("", 0, 0),
                                                                      ("", 0, 0)]
    assert bn2.param[0].lr_mult == 1
    assert notes == ["Attempting to upgrade batch norm layers using deprecated params: "
                     "net.prototxt",
                     "Successfully upgraded batch norm layers using deprecated params."]


def test_needs_upgrade_helpers():
    assert not upgrade.needs_upgrade(net('layer { name: "a" type: "ReLU" }'))
    assert upgrade.net_needs_v1_to_v2_upgrade(net('layers { name: "a" type: RELU }'))
    assert not upgrade.net_needs_v0_to_v1_upgrade(net('layers { name: "a" type: RELU }'))
    assert upgrade.net_needs_v0_to_v1_upgrade(net('layers { layer { type: "relu" } }'))
    assert upgrade.net_needs_data_upgrade(net('layers { type: DATA data_param { mirror: false } }'))
    assert not upgrade.net_needs_data_upgrade(
        net('layers { type: DATA data_param { source: "x" } }'))
    assert upgrade.net_needs_input_upgrade(net('input: "x"'))
    assert upgrade.net_needs_batch_norm_upgrade(
        net('layer { type: "BatchNorm" param {} param {} param {} }'))
    assert upgrade.needs_upgrade(
        caffe_pb2.SolverParameter(solver_type=caffe_pb2.SolverParameter.ADAM))
    assert not upgrade.needs_upgrade(caffe_pb2.SolverParameter(type="Adam"))


# ------------------------------------------------------------------------------------------------
# Solver
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("enum, name", [("SGD", "SGD"), ("NESTEROV", "Nesterov"),
                                        ("ADAGRAD", "AdaGrad"), ("RMSPROP", "RMSProp"),
                                        ("ADADELTA", "AdaDelta"), ("ADAM", "Adam")])
def test_solver_type_enum_becomes_type_string(enum, name):
    param = text_format.Parse(f"solver_type: {enum}", caffe_pb2.SolverParameter())
    notes = []
    assert upgrade.upgrade_solver_as_needed(param, "s.prototxt", notes)
    assert param.type == name and not param.HasField("solver_type")
    assert notes[0] == ("Attempting to upgrade input file specified using deprecated "
                        "'solver_type' field (enum)': s.prototxt")


def test_solver_type_and_enum_together_is_fatal():
    param = text_format.Parse('solver_type: SGD type: "SGD"', caffe_pb2.SolverParameter())
    with pytest.raises(CaffeError, match="cannot be both specified"):
        upgrade.upgrade_solver(param, "s.prototxt")


def test_real_legacy_solvers_upgrade(tmp_path):
    cases = {"mnist_autoencoder_solver_adagrad.prototxt": "AdaGrad",
             "mnist_autoencoder_solver_nesterov.prototxt": "Nesterov",
             "lenet_solver_baseline_q2_drop.prototxt": "SGD"}
    for name, expected in cases.items():
        param = pio.read_solver_param(str(REALWORLD / "yuvval__nn_ex1/examples/mnist" / name))
        assert param.type == expected


def test_snapshot_prefix_defaults_like_caffe(tmp_path):
    param = caffe_pb2.SolverParameter()
    upgrade.upgrade_solver(param, str(tmp_path / "solver.prototxt"))
    assert param.snapshot_prefix == str(tmp_path / "solver")
    param = caffe_pb2.SolverParameter(snapshot_prefix=str(tmp_path))
    upgrade.upgrade_solver(param, "a/b/my_solver.prototxt")
    assert param.snapshot_prefix == str(tmp_path / "my_solver")


# ------------------------------------------------------------------------------------------------
# The tools
# ------------------------------------------------------------------------------------------------
def tool(name, *args):
    proc = subprocess.run([sys.executable, str(TOOLS / f"{name}.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=60)
    return proc.returncode, proc.stdout, proc.stderr


def run_tool(name, *args, capsys=None):
    """In-process run (fast); returns (status, stderr)."""
    status = upgrade_proto.run(name, [str(a) for a in args])
    return status, capsys.readouterr().err if capsys else ""


def test_upgrade_net_proto_text_on_a_real_v1_net(tmp_path, capsys):
    src = REALWORLD / "natanielruiz__net-archive/nin-cifar10/train_val.prototxt"
    out = tmp_path / "nin.prototxt"
    status, err = run_tool("upgrade_net_proto_text", src, out, capsys=capsys)
    assert status == 0
    written = pio.read_text(str(out), caffe_pb2.NetParameter())
    assert not len(written.layers) and len(written.layer) == 27
    assert written == pio.read_net_param(str(src))
    assert f"Wrote upgraded NetParameter text proto to {out}" in err
    # Already current: written back unchanged, with Caffe's note, status 0.
    again = tmp_path / "again.prototxt"
    status, err = run_tool("upgrade_net_proto_text", out, again, capsys=capsys)
    assert status == 0 and f"File already in latest proto format: {out}" in err
    assert pio.read_text(str(again), caffe_pb2.NetParameter()) == written


def test_upgrade_net_proto_text_reports_problems_with_status_1(tmp_path, capsys):
    src = tmp_path / "bad.prototxt"
    src.write_text('input: "a"\nlayers { layer { name: "r" type: "relu" num_output: 3 } '
                   'bottom: "a" top: "a" }\n')
    status, err = run_tool("upgrade_net_proto_text", src, tmp_path / "out.prototxt",
                           capsys=capsys)
    assert status == 1
    assert "Encountered error(s) while upgrading prototxt; see details above." in err
    assert (tmp_path / "out.prototxt").exists()   # written anyway, as Caffe does


def _one_error_line(err, name):
    """The tool's error is its last line, the only one naming the tool."""
    lines = err.strip().splitlines()
    return [line for line in lines if line.startswith(f"{name}: ")] == lines[-1:]


def test_upgrade_tools_errors_are_one_line(tmp_path, capsys):
    status, err = run_tool("upgrade_net_proto_text", tmp_path / "missing.prototxt",
                           tmp_path / "o", capsys=capsys)
    assert status == 1 and err.count("\n") == 1
    assert err.startswith("upgrade_net_proto_text: ") and "missing.prototxt" in err
    fork = REALWORLD / "natanielruiz__net-archive/parsenet/VGG_VOC2012ext.prototxt"
    status, err = run_tool("upgrade_net_proto_text", fork, tmp_path / "o", capsys=capsys)
    assert status == 1 and err.count("\n") == 1 and 'no field named "filter_stride"' in err
    status, err = run_tool("upgrade_net_proto_binary", fork, tmp_path / "o", capsys=capsys)
    assert status == 1 and err.count("\n") == 1 and "not a valid" in err
    bad = tmp_path / "both.prototxt"
    bad.write_text('solver_type: SGD\ntype: "Adam"\n')
    status, err = run_tool("upgrade_solver_proto_text", bad, tmp_path / "o", capsys=capsys)
    assert status == 1 and _one_error_line(err, "upgrade_solver_proto_text")
    assert "cannot be both specified" in err.strip().splitlines()[-1]
    assert not (tmp_path / "o").exists()
    status, err = run_tool("upgrade_solver_proto_text", bad, capsys=capsys)
    assert status == 1 and "usage: upgrade_solver_proto_text" in err


def test_upgrade_solver_proto_text(tmp_path, capsys):
    src = REALWORLD / "yuvval__nn_ex1/examples/mnist/mnist_autoencoder_solver_nesterov.prototxt"
    out = tmp_path / "solver.prototxt"
    status, err = run_tool("upgrade_solver_proto_text", src, out, capsys=capsys)
    assert status == 0
    written = pio.read_text(str(out), caffe_pb2.SolverParameter())
    assert written.type == "Nesterov" and not written.HasField("solver_type")
    # Only the type changes: the tool does not default snapshot_prefix.
    original = pio.read_text(str(src), caffe_pb2.SolverParameter())
    original.ClearField("solver_type")
    original.type = "Nesterov"
    assert written == original
    current = REALWORLD / "Mounika1494__EYE-FOR-THE-BLIND/examples/mnist/lenet_solver_adam.prototxt"
    status, err = run_tool("upgrade_solver_proto_text", current, tmp_path / "s2", capsys=capsys)
    assert status == 0 and "File already in latest proto format" in err


def to_v1_binary(param):
    """A V2 NetParameter rewritten in the legacy V1 ``layers`` format (as old .caffemodels are)."""
    names = {v: k for k, v in upgrade.V1_TYPE_NAMES.items()}
    out = caffe_pb2.NetParameter(name=param.name)
    for lp in param.layer:
        v1 = out.layers.add(name=lp.name, type=names[lp.type])
        v1.bottom.extend(lp.bottom)
        v1.top.extend(lp.top)
        for bp in lp.blobs:
            v1.blobs.add().CopyFrom(bp)
    return out


def test_upgrade_net_proto_binary_on_a_v1_caffemodel(tmp_path, capsys):
    src = REALWORLD / "Mounika1494__EYE-FOR-THE-BLIND/examples/mnist/lenet_iter_10000.caffemodel"
    original = pio.read_binary(str(src), caffe_pb2.NetParameter())
    legacy = tmp_path / "lenet_v1.caffemodel"
    pio.write_binary(str(legacy), to_v1_binary(original))
    out = tmp_path / "lenet_v2.caffemodel"
    status, err = run_tool("upgrade_net_proto_binary", legacy, out, capsys=capsys)
    assert status == 0 and "Wrote upgraded NetParameter binary proto to" in err
    written = pio.read_binary(str(out), caffe_pb2.NetParameter())
    assert not len(written.layers)
    assert [(lp.name, lp.type) for lp in written.layer] == \
        [(lp.name, lp.type) for lp in original.layer]
    for a, b in zip(written.layer, original.layer):
        for x, y in zip(a.blobs, b.blobs):
            numpy.testing.assert_array_equal(proto_to_array(x), proto_to_array(y))


def test_tools_run_as_scripts(tmp_path):
    status, out, err = tool("upgrade_net_proto_text", "--help")
    assert status == 0 and "usage: upgrade_net_proto_text" in out
    status, out, err = tool("upgrade_net_proto_binary")
    assert status == 1 and err.strip().splitlines()[-1].startswith("upgrade_net_proto_binary: ")
    src = REALWORLD / "yuvval__nn_ex1/examples/mnist/mnist_autoencoder_solver_adagrad.prototxt"
    status, out, err = tool("upgrade_solver_proto_text", src, tmp_path / "s.prototxt")
    assert status == 0 and 'type: "AdaGrad"' in (tmp_path / "s.prototxt").read_text()
