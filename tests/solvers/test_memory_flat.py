"""Memory stays flat over a long run (issue 15): LeNet on the shared MNIST LMDBs for 2,000
iterations with a test every 500, in its own process; the resident set after warm-up (iteration
200) and at the end differ by less than 5 % (and 30 MiB). A leak of one batch an iteration
(64 x 784 float32, 200 KB) would add 350 MB.
"""
import json
import subprocess
import sys

import pytest

from paths import ROOT

SCRIPT = r"""
import json, sys
sys.path.insert(0, {tools!r})
import bench_process
import caffe_engine as caffe

def rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024

from caffe_engine.io import prototxt as pio
path = bench_process.write_solver({folder!r}, bench_process.SHARED_MNIST)
param = pio.read_solver_param(path)
param.max_iter, param.test_interval, param.display = 2000, 500, 0
solver = caffe.get_solver(param)
solver.step(200)
warm = rss_mib()
solver.step(1800)
print(json.dumps({{"warm": warm, "end": rss_mib(), "iter": solver.iter}}))
"""


@pytest.mark.slow
def test_resident_memory_is_flat_over_two_thousand_iterations(tmp_path):
    code = SCRIPT.format(tools=str(ROOT / "tools"), folder=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=900, cwd=tmp_path, env={"GLOG_logtostderr": "1",
                                                          "PATH": "/usr/bin:/bin",
                                                          "OMP_NUM_THREADS": "2"})
    assert done.returncode == 0, done.stderr[-3000:]
    rss = json.loads(done.stdout.strip().splitlines()[-1])
    print(rss)
    assert rss["iter"] == 2000
    assert rss["end"] - rss["warm"] < max(30, 0.05 * rss["warm"]), rss
