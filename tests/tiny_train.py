"""Small training setups shared by the tests: MNIST through one InnerProduct, written as
net.prototxt + solver.prototxt, and ``caffe train`` run as a subprocess (resume, CLI tests);
the lenet_sgd fixture's solver in process (``lenet_solver``: host-read and fake-GPU tests)."""
import re
import subprocess
import sys
from pathlib import Path

from caffe_engine.layers import layer_type_list
from paths import SHARED

DATA = SHARED / "data" / "mnist_5k"
HAS_DROPOUT = "Dropout" in layer_type_list()


def tiny_net(dropout=HAS_DROPOUT):
    """MNIST through one InnerProduct: random crops and mirrors (the transformer's stream), an
    optional Dropout (the global stream), and a TEST net with its own cursor."""
    drop = ('layer { name: "drop" type: "Dropout" bottom: "ip" top: "ip" '
            "dropout_param { dropout_ratio: 0.3 } }\n") if dropout else ""
    return f"""name: "tiny"
layer {{ name: "mnist" type: "Data" top: "data" top: "label" include {{ phase: TRAIN }}
  transform_param {{ scale: 0.00390625 crop_size: 24 mirror: true }}
  data_param {{ source: "{DATA}/mnist_train_lmdb" batch_size: 16 backend: LMDB }} }}
layer {{ name: "mnist" type: "Data" top: "data" top: "label" include {{ phase: TEST }}
  transform_param {{ scale: 0.00390625 crop_size: 24 }}
  data_param {{ source: "{DATA}/mnist_test_lmdb" batch_size: 50 backend: LMDB }} }}
layer {{ name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  param {{ lr_mult: 1 }} param {{ lr_mult: 2 }}
  inner_product_param {{ num_output: 10 weight_filler {{ type: "xavier" }} }} }}
{drop}layer {{ name: "accuracy" type: "Accuracy" bottom: "ip" bottom: "label" top: "accuracy"
  include {{ phase: TEST }} }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }}
"""


HYPER = {"SGD": "momentum: 0.9", "Nesterov": "momentum: 0.9", "AdaGrad": "", "RMSProp": "rms_decay: 0.9",
         "AdaDelta": "momentum: 0.95", "Adam": "momentum: 0.9 momentum2: 0.999"}


def tiny_solver(folder, kind="SGD", max_iter=12, extra=""):
    """Write net.prototxt and solver.prototxt into ``folder``; returns the solver path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "net.prototxt").write_text(tiny_net())
    base_lr = 0.5 if kind == "AdaDelta" else 0.01
    defaults = (f'net: "net.prototxt"\ntype: "{kind}"\n{HYPER[kind]}\nbase_lr: {base_lr}\n'
                f'lr_policy: "step"\ngamma: 0.5\nstepsize: 5\nweight_decay: 0.0005\n'
                f"test_iter: 2\ntest_interval: 4\ndisplay: 1\naverage_loss: 3\n"
                f'max_iter: {max_iter}\nsnapshot_prefix: "tiny"\nrandom_seed: 77\nsolver_mode: CPU\n')
    # A field in ``extra`` replaces the default's (the parser, as Caffe's, refuses a
    # non-repeated field given twice).
    given = set(re.findall(r"^\s*(\w+)\s*:", extra, re.M))
    kept = [line for line in defaults.splitlines(keepends=True)
            if line.split(":", 1)[0].strip() not in given]
    (folder / "solver.prototxt").write_text("".join(kept) + extra)
    return folder / "solver.prototxt"


def caffe(folder, *args):
    """``caffe train ARGS`` started in ``folder``, its log on a pipe (see :func:`wait_for`)."""
    return subprocess.Popen([sys.executable, "-m", "caffe_engine", "train", *args], cwd=folder,
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)


def wait_for(proc, pattern):
    """Read the log until a line matches ``pattern``; returns the lines read."""
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if re.search(pattern, line):
            return lines
    raise AssertionError("pattern not seen: " + pattern + "\n" + "".join(lines[-20:]))


def lenet_solver(display=4, batch=16, **fields):
    """The lenet_sgd fixture's solver (``paths.TRAINING``) with its net inline, Data sources on
    the MNIST LMDBs of ../shared (:data:`DATA`), ``batch`` images per batch, no test net, no
    snapshots; ``fields`` override SolverParameter fields. A solver of the current mode."""
    from caffe_engine.io import prototxt as pio
    from caffe_engine.solvers import get_solver
    from paths import TRAINING
    case = TRAINING / "lenet_sgd"
    param = pio.read_solver_param(str(case / "solver.prototxt"))
    net = pio.read_net_param(str(case / "net.prototxt"))
    for layer in net.layer:
        if layer.type == "Data":
            layer.data_param.source = str(DATA / layer.data_param.source.rsplit("/", 1)[1])
            layer.data_param.batch_size = batch
    param.ClearField("net")
    param.net_param.CopyFrom(net)
    del param.test_iter[:]
    param.test_interval = 0
    param.display = display
    param.snapshot_after_train = False
    for name, value in fields.items():
        setattr(param, name, value)
    return get_solver(param)
