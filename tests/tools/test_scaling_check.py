"""tools/scaling_check.py's options and bookkeeping, without a lab, MPI or a training run:
argument parsing (bucket lists with auto, overlap, --netlab's defaults), the order of the runs,
reading a log, the settings table, the solver copy pointed at a data folder, the ranks' env.

Oracles: logs and runs written by hand (their medians and spreads worked out here), and the
cifar10_quick prototxts of models/.
"""
import importlib.util
import os

import pytest

from caffe_engine.io import prototxt
from caffe_engine.proto import caffe_pb2
from paths import ROOT

SPEC = importlib.util.spec_from_file_location("scaling_check", ROOT / "tools" / "scaling_check.py")
sc = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(sc)

LOG = """I1201 solver.cpp] Iteration 0 (0 iter/s, 0.5s/5 iters), loss = 2.3
I1201 solver.cpp] Iteration 5 (1.5 iter/s, 3.3s/5 iters), loss = 2.3
I1201 bucket_plan.py] Buckets (--bucket_mb auto, MG-WFBP): alpha 0.3 ms, beta 36 ns/byte \
(measured); 5 bucket(s): ip2 2.54 KiB, ip1 256 KiB; predicted backward 216 ms
I1201 solver.cpp] Iteration 10 (2 iter/s, 2.5s/5 iters), loss = 2.2
I1201 solver.cpp] Iteration 15 (4 iter/s, 1.2s/5 iters), loss = 2.2
I1201 solver.cpp] Iteration 20 (3 iter/s, 1.6s/5 iters), loss = 2.1
I1201 solver.cpp] Iteration 25 (5 iter/s, 1s/5 iters), loss = 2.1
I1201 solver.cpp] Iteration 30, loss = 2.0
"""


def test_bucket_list_with_auto_and_overlap_both():
    args = sc.parse_args(["--bucket_mb", "0.001", "25", "auto", "--overlap", "on", "off",
                          "--procs", "1", "4", "--repeats", "3"])
    assert args.bucket_mb == ["0.001", "25", "auto"]
    assert args.overlap == ["on", "off"]
    assert (args.netlab, args.threads, args.no_predict) == (False, None, False)
    assert sc.parse_args([]).bucket_mb == ["25"]          # caffe train's default, as before


def test_netlab_defaults():
    args = sc.parse_args(["--netlab", "--procs", "1", "2"])
    assert (args.netlab, args.bandwidth, args.netmod, args.threads, args.no_predict) == \
        (True, "1gbit", "ofi", 1, True)
    assert sc.parse_args(["--netlab", "--threads", "2", "--bandwidth", "100mbit"]).threads == 2


@pytest.mark.parametrize("argv", [["--bucket_mb", "0"], ["--bucket_mb", "big"],
                                  ["--bucket_mb", "-1"], ["--overlap", "maybe"],
                                  ["--repeats", "0"],
                                  ["--iters", "60", "--display", "5", "--skip_iters", "55"]])
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as info:
        sc.parse_args(argv)
    assert info.value.code == 2
    assert "error" in capsys.readouterr().err


def test_skip_iters_leaving_one_rate_is_fine():
    sc.parse_args(["--iters", "60", "--display", "5", "--skip_iters", "54"])


def test_settings_order_and_one_run_for_p1():
    assert sc.settings([1, 4], ["0.1", "auto"], ["on", "off"]) == [
        (1, None, None), (4, "0.1", "on"), (4, "0.1", "off"), (4, "auto", "on"),
        (4, "auto", "off")]


def test_rates_and_plan_from_a_log():
    assert sc.run_rate(LOG) == ([1.5, 2.0, 4.0, 3.0, 5.0], 3.0)   # iteration 0's dropped
    assert sc.run_rate(LOG, skip_iters=10) == ([4.0, 3.0, 5.0], 4.0)
    assert sc.run_rate(LOG, skip_iters=25) == ([], None)
    assert sc.plan_line(LOG).startswith("Buckets (--bucket_mb auto, MG-WFBP): alpha 0.3 ms")
    trial = ("I1201 bucket_plan.py] Buckets (--bucket_mb auto): tried, median iteration: in use "
             "(1 bucket(s)) 433 ms, MG-WFBP (4 bucket(s)) 471 ms\n"
             "I1201 bucket_plan.py] Buckets (--bucket_mb auto): 1 bucket(s): conv1..ip2 559 KiB "
             "(kept: in use)\n")
    joined = sc.plan_line(LOG + trial).split(" / ")
    assert len(joined) == 3 and joined[0] == sc.plan_line(LOG)
    assert joined[2].endswith("(kept: in use)") and sc.plan_line("no plan here") is None
    assert sc.plan_line(LOG).endswith("predicted backward 216 ms")
    assert sc.plan_line("Iteration 5 (1 iter/s") is None


def run(p, bucket, overlap, median, plan=None):
    return {"procs": p, "bucket_mb": bucket, "overlap": overlap, "median": median, "plan": plan,
            "rates": [median]}


def test_summary_medians_spreads_speedups_and_table():
    runs = [run(1, None, None, 4.0), run(4, "25", "on", 2.0), run(4, "auto", "on", 2.2, "P1"),
            run(1, None, None, 6.0), run(4, "25", "on", 2.5), run(4, "auto", "on", 1.8, "P2"),
            run(1, None, None, 5.0), run(4, "25", "on", 3.0), run(4, "auto", "on", 2.0, "P3")]
    rows = sc.summarize(runs, batch=100)
    assert [(r["procs"], r["bucket_mb"]) for r in rows] == [(1, None), (4, "25"), (4, "auto")]
    one, fixed, auto = rows
    assert (one["median"], one["low"], one["high"], one["speedup"]) == (5.0, 4.0, 6.0, 1.0)
    assert one["spread"] == pytest.approx(0.4)
    assert fixed["median"] == 2.5 and fixed["images_s"] == pytest.approx(1000.0)
    assert fixed["speedup"] == pytest.approx(4 * 2.5 / 5.0)
    assert auto["median"] == 2.0 and auto["plans"] == ["P1", "P2", "P3"]
    table = sc.settings_table(rows)
    lines = table.splitlines()
    assert lines[0].startswith("| P | --bucket_mb | overlap | iterations/s")
    assert lines[2] == "| 1 | - | - | 5.000 (4.000-6.000) | 40 % | 500 | 1.00 | 3 |"
    assert lines[3] == "| 4 | 25 | on | 2.500 (2.000-3.000) | 40 % | 1000 | 2.00 | 3 |"
    assert lines[4] == "| 4 | auto | on | 2.000 (1.800-2.200) | 20 % | 800 | 1.60 | 3 |"
    assert "- P = 4, overlap on: `P2`" in table
    # Without a P = 1 run there is no speedup.
    assert sc.summarize([run(2, "25", "off", 1.0)], 10)[0]["speedup"] is None


def test_solver_copy_points_at_the_data_folder(tmp_path):
    data = tmp_path / "cifar"
    path = sc.write_solver("models/cifar10_quick/cifar10_quick_solver.prototxt", 60,
                           str(tmp_path), display=5, data=str(data))
    param = caffe_pb2.SolverParameter()
    prototxt.read_text(path, param, "solver")
    assert (param.max_iter, param.display, param.test_interval, param.snapshot) == (60, 5, 61, 0)
    assert not param.test_iter and not param.snapshot_after_train
    net = prototxt.read_net_param(param.net)
    sources = {(tuple(r.phase for r in layer.include), layer.data_param.source,
                layer.transform_param.mean_file) for layer in net.layer if layer.type == "Data"}
    mean = str(data / "mean.binaryproto")
    assert sources == {((caffe_pb2.TRAIN,), str(data / "train_lmdb"), mean),
                       ((caffe_pb2.TEST,), str(data / "test_lmdb"), mean)}
    # Without --data the net is the original, by absolute path.
    plain = sc.write_solver("models/cifar10_quick/cifar10_quick_solver.prototxt", 8,
                            str(tmp_path))
    param = caffe_pb2.SolverParameter()
    prototxt.read_text(plain, param, "solver")
    assert param.net == os.path.abspath(ROOT / "models/cifar10_quick/"
                                        "cifar10_quick_train_test.prototxt")
    assert param.display == 1


def test_rank_environment(monkeypatch):
    monkeypatch.setenv("CAFFE_GRAD_OVERLAP", "0")
    env = sc.run_env("off", threads=1, netmod="ofi", cost_model_path="m.json")
    assert env["CAFFE_GRAD_OVERLAP"] == "0"
    assert env["OMP_NUM_THREADS"] == env["OPENBLAS_NUM_THREADS"] == "1"
    assert env["MPIR_CVAR_CH4_NETMOD"] == "ofi"
    assert env["CAFFE_COST_MODEL"] == os.path.abspath("m.json")
    assert sc.run_env("on")["CAFFE_GRAD_OVERLAP"] == "1"
    plain = sc.run_env(None, netmod="default")
    assert "CAFFE_GRAD_OVERLAP" not in plain and "MPIR_CVAR_CH4_NETMOD" not in plain
    assert sc.train_argv("s.prototxt", "tree", "auto")[-1] == "--bucket_mb=auto"
    assert not any(a.startswith("--bucket_mb") for a in sc.train_argv("s", "tree", None))


def test_data_folder_layouts(tmp_path):
    (tmp_path / "a" / "train_lmdb").mkdir(parents=True)
    (tmp_path / "a" / "test_lmdb").mkdir()
    (tmp_path / "b" / "mnist_train_lmdb").mkdir(parents=True)
    (tmp_path / "b" / "mnist_test_lmdb").mkdir()
    assert sc.data_sources(str(tmp_path / "a")) == (str(tmp_path / "a" / "train_lmdb"),
                                                    str(tmp_path / "a" / "test_lmdb"))
    assert sc.data_sources(str(tmp_path / "b")) == (str(tmp_path / "b" / "mnist_train_lmdb"),
                                                    str(tmp_path / "b" / "mnist_test_lmdb"))
    assert sc.data_sources(str(tmp_path / "none")) == (str(tmp_path / "none" / "train_lmdb"),
                                                       str(tmp_path / "none" / "test_lmdb"))


# -- gradient compression -------------------------------------------------------------------------
TRAFFIC = """I1202 solver.py] Iteration 2 (0.5 iter/s, 4s/2 iters), loss = 2.3
I1202 data_parallel.py] Iteration 2, gradient traffic (gtopk): 140000 bytes sent per iteration \
by the busiest rank (this rank 140000, mean 105000 over 8 ranks); a dense ring allreduce sends 1
I1202 solver.py] Iteration 4 (0.8 iter/s, 2.5s/2 iters), loss = 2.2
I1202 data_parallel.py] Iteration 4, gradient traffic (gtopk): 139800 bytes sent per iteration \
by the busiest rank (this rank 139800, mean 104850 over 8 ranks); a dense ring allreduce sends 1
I1202 solver.py] Iteration 6 (0.9 iter/s, 2.2s/2 iters), loss = 2.2
I1202 data_parallel.py] Iteration 6, gradient traffic (gtopk): 139600 bytes sent per iteration \
by the busiest rank (this rank 139600, mean 104700 over 8 ranks); a dense ring allreduce sends 1
"""


def test_compress_arguments_and_settings():
    args = sc.parse_args(["--compress", "none", "fp16", "topk", "gtopk",
                          "--density", "0.001", "0.01", "--procs", "1", "8"])
    assert args.compress == ["none", "fp16", "topk", "gtopk"] and args.density == [0.001, 0.01]
    assert sc.parse_args([]).compress is None and not sc.parse_args([]).no_error_feedback
    assert sc.compress_settings(args.compress, args.density) == [
        ("none", None), ("fp16", None), ("topk", 0.001), ("topk", 0.01), ("gtopk", 0.001),
        ("gtopk", 0.01)]
    assert sc.compress_settings(None, [0.001]) == [(None, None)]


@pytest.mark.parametrize("argv", [["--compress", "zip"], ["--density", "0"],
                                  ["--density", "1.5"],
                                  ["--link_model", "m.json"]])      # needs --compress
def test_bad_compress_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as info:
        sc.parse_args(argv)
    assert info.value.code == 2


def test_train_argv_passes_the_compression_flags():
    argv = sc.train_argv("s", "tree", "25", "gtopk", 0.001)
    assert argv[-3:] == ["--bucket_mb=25", "--comm_compress=gtopk", "--comm_density=0.001"]
    assert sc.train_argv("s", "tree", None, "fp16", None)[-1] == "--comm_compress=fp16"
    assert sc.train_argv("s", "tree", None, "topk", 0.01, False)[-2:] == [
        "--comm_density=0.01", "--nocomm_error_feedback"]
    assert sc.train_argv("s", "tree", None) == sc.train_argv("s", "tree", None, None, None)
    assert not any("comm_compress" in a for a in sc.train_argv("s", "tree", "25"))


def test_traffic_bytes_from_a_log():
    assert sc.traffic_bytes(TRAFFIC) == ("gtopk", 139800.0)          # median of 3
    assert sc.traffic_bytes(TRAFFIC, skip_iters=4) == ("gtopk", 139600.0)
    assert sc.traffic_bytes(TRAFFIC, skip_iters=10) == ("gtopk", 139800.0)   # all if none left
    assert sc.traffic_bytes(LOG) == (None, None)
    assert sc.run_rate(TRAFFIC, skip_iters=2) == ([0.8, 0.9], pytest.approx(0.85))


def crun(p, method, density, median, sent=None):
    out = run(p, None if p == 1 else "25", None if p == 1 else "on", median)
    out.update({"compress": method, "density": density, "bytes_iter": sent})
    return out


def test_summary_and_table_with_compression_and_predictions():
    runs = [crun(1, None, None, 4.0), crun(8, "none", None, 0.1),
            crun(8, "gtopk", 0.001, 1.0, 139800.0), crun(1, None, None, 4.0),
            crun(8, "none", None, 0.12), crun(8, "gtopk", 0.001, 0.8, 139600.0)]
    rows = sc.summarize(runs, batch=4)
    assert [(r["procs"], r["compress"], r["density"]) for r in rows] == [
        (1, None, None), (8, "none", None), (8, "gtopk", 0.001)]
    assert rows[2]["median"] == pytest.approx(0.9) and rows[2]["bytes_iter"] == 139700.0
    assert rows[1]["bytes_iter"] is None
    model = sc.link_model.LinkModel(1e-3, 1e-9)
    sc.add_predictions(rows, model, [1_000_000], cores=2, select_s={0.001: 0.05})
    assert "predicted_s" not in rows[0]
    dense = rows[1]["predicted_parts"]
    assert dense["compute"] == pytest.approx(0.25 * 4) and dense["select"] == 0.0
    assert dense["comm"] == pytest.approx(model.predict("tree", 4e6, 8, 1))
    sparse = rows[2]["predicted_parts"]
    assert sparse["select"] == pytest.approx(0.2)
    assert sparse["comm"] == pytest.approx(
        sc.compressed.compressed_allreduce_time("gtopk", 4e6, 8, model, 0.001))
    table = sc.settings_table(rows).splitlines()
    assert table[0].startswith("| P | compress | density | --bucket_mb | overlap |")
    assert table[0].endswith("| measured/predicted |")
    assert table[2].startswith("| 1 | - | - | - | - | 4.000 (4.000-4.000) | 0 % | 250 | - |")
    assert table[4].startswith("| 8 | gtopk | 0.001 | 25 | on | 0.900 (0.800-1.000) | 22 % | "
                               "1111 | 139700 | 29 | 1.80 | 2 |")
    ratio = (1 / 0.9) / rows[2]["predicted_s"]
    assert table[4].endswith(f" | {ratio:.2f} |")
    # Without predictions the table stops at runs.
    plain = sc.settings_table(sc.summarize(runs, batch=4)).splitlines()
    assert plain[0].endswith("| runs |") and plain[3].endswith("| 0.22 | 2 |")


def test_bucket_counts_cut_in_backward_order():
    grads = {"conv1": 4 * 100, "ip1": 4 * 1000, "ip2": 4 * 50}
    assert sc.bucket_counts(grads, 25) == [1150]
    cap = 4 * 1000 / (1 << 20)                      # 1000 floats
    assert sc.bucket_counts(grads, cap) == [50, 1000, 100]
    assert sc.bucket_counts(grads, 4 * 1050 / (1 << 20)) == [1050, 100]
