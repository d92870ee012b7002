"""Every console command setup.cfg installs names a function that exists, and the tools a Caffe
user looks for under Caffe's names are there.

Oracle: setup.cfg itself (what ``pip install`` writes into bin/) and BVLC Caffe's tools/ and
python/ command names.
"""
import configparser
import importlib
import subprocess
import sys

from paths import ROOT


def console_scripts():
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    lines = config["options.entry_points"]["console_scripts"].strip().splitlines()
    return dict(line.replace(" ", "").split("=", 1) for line in lines)


def test_every_console_command_resolves_to_a_function():
    for name, target in console_scripts().items():
        module, function = target.split(":")
        assert callable(getattr(importlib.import_module(module), function)), name


def test_caffe_users_tools_are_installed_under_their_names():
    names = set(console_scripts())
    assert {"caffe", "convert_imageset", "compute_image_mean", "extract_features", "draw_net",
            "parse_log", "caffe_repro_check"} <= names


def test_repro_check_answers_help_and_refuses_a_missing_log_in_one_line(tmp_path):
    module = console_scripts()["caffe_repro_check"].split(":")[0]
    done = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and "--log" in done.stdout
    solver = tmp_path / "solver.prototxt"
    solver.write_text('net: "net.prototxt"\n')
    done = subprocess.run([sys.executable, "-m", module, str(solver), "--log",
                           str(tmp_path / "missing.log")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "missing.log" in done.stderr
