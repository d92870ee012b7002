"""glog's log files and ``GLOG_*`` settings for the ``caffe`` command (caffe_engine.log).

glog (src/logging.cc): a message of severity S goes to the log files of S and every lower
severity, each created when its first message arrives as
``<program>.<host>.<user>.log.<SEVERITY>.<yyyymmdd>-<hhmmss>.<pid>`` in ``GLOG_log_dir``, with the
symlink ``<program>.<SEVERITY>``; Caffe's main sets ``alsologtostderr``, so stderr gets the same
lines. The conftest sets ``GLOG_logtostderr=1`` for the suite; these tests set their own.
"""
import importlib
import io
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from caffe_engine.log import GlogFlags, env_bool, env_int, init_glog, logger
from tiny_train import tiny_solver

glog = importlib.import_module("caffe_engine.log")   # the package's ``log`` is pycaffe's function

HEADER = [r"Log file created at: \d{4}/\d\d/\d\d \d\d:\d\d:\d\d$",
          r"Running on machine: " + re.escape(glog.host_name()) + "$",
          r"Running duration \(h:mm:ss\): \d+:\d\d:\d\d$",
          re.escape("Log line format: [IWEF]yyyymmdd hh:mm:ss.uuuuuu threadid file:line] msg") + "$"]
LINE = re.compile(r"^([IWEF])\d{8} \d\d:\d\d:\d\d\.\d{6} +\d+ \S+:\d+\] ")

DEPLOY = """name: "tiny_deploy"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 8 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
"""


def clean_env(**extra):
    """The environment without any GLOG_*/GOOGLE_* setting, plus ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GLOG_", "GOOGLE_")) and k != "TEST_TMPDIR"}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def caffe(*args, cwd, env):
    """Run ``python -m caffe_engine ARGS``; returns (exit status, stderr, pid)."""
    proc = subprocess.Popen([sys.executable, "-m", "caffe_engine", *args], cwd=cwd, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate(timeout=300)
    return proc.returncode, err, proc.pid


def file_name_re(program, severity, pid):
    return re.compile(r"^%s\.%s\.%s\.log\.%s\.\d{8}-\d{6}\.%d$" % (
        re.escape(program), re.escape(glog.host_name()), re.escape(glog.user_name()), severity, pid))


def split_file(path):
    """(header lines, the rest as text) of a glog log file."""
    text = Path(path).read_text()
    lines = text.split("\n", 4)
    for pattern, line in zip(HEADER, lines[:4]):
        assert re.match(pattern, line), (pattern, line)
    return lines[:4], lines[4]


def letters(text):
    return {m.group(1) for m in map(LINE.match, text.splitlines()) if m}


def test_log_dir_gets_the_info_file_and_symlink_with_the_stderr_lines(tmp_path):
    folder, logs = tmp_path / "run", tmp_path / "logs"
    logs.mkdir()
    tiny_solver(folder, max_iter=2)
    rc, err, pid = caffe("train", "--solver=solver.prototxt", cwd=folder,
                         env=clean_env(GLOG_log_dir=logs))
    assert rc == 0, err[-2000:]
    names = sorted(p.name for p in logs.iterdir())
    info = [n for n in names if file_name_re("caffe", "INFO", pid).match(n)]
    assert len(info) == 1, names
    link = logs / "caffe.INFO"
    assert link.is_symlink() and os.readlink(link) == info[0]    # relative, as glog makes it
    _, body = split_file(logs / info[0])
    assert body == err                                         # the same lines as on stderr
    assert "Optimization Done." in body and "I" in letters(body)
    # Other severities' files exist exactly when such lines were logged.
    for severity, letter in (("WARNING", "W"), ("ERROR", "E")):
        assert (logs / f"caffe.{severity}").exists() == (letter in letters(err))
    for n in names:                                            # nothing else in the folder
        assert n in ("caffe.INFO", "caffe.WARNING", "caffe.ERROR") or any(
            file_name_re("caffe", s, pid).match(n) for s in ("INFO", "WARNING", "ERROR")), n


def test_minloglevel_1_silences_info_on_stderr_and_in_the_files(tmp_path):
    folder, logs = tmp_path / "run", tmp_path / "logs"
    logs.mkdir()
    tiny_solver(folder, max_iter=2)
    rc, err, _ = caffe("train", "--solver=solver.prototxt", cwd=folder,
                       env=clean_env(GLOG_log_dir=logs, GLOG_minloglevel=1))
    assert rc == 0, err[-2000:]
    assert "I" not in letters(err) and "Optimization Done." not in err
    assert (folder / "tiny_iter_2.caffemodel").exists()        # it did train
    for path in logs.iterdir():
        if not path.is_symlink():
            assert "I" not in letters(split_file(path)[1])
    assert not (logs / "caffe.INFO").exists() or "W" in letters(err)


def test_logtostderr_writes_no_files(tmp_path):
    logs, tmp = tmp_path / "logs", tmp_path / "tmp"
    logs.mkdir()
    tmp.mkdir()
    (tmp_path / "deploy.prototxt").write_text(DEPLOY)
    rc, err, _ = caffe("time", "--model=deploy.prototxt", "--iterations=1", cwd=tmp_path,
                       env=clean_env(GLOG_logtostderr=1, GLOG_log_dir=logs, TMPDIR=tmp))
    assert rc == 0, err[-2000:]
    assert "Average Forward pass" in err
    assert list(logs.iterdir()) == [] and list(tmp.iterdir()) == []


def test_default_folder_is_tmpdir_and_errors_reach_the_files(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    rc, err, pid = caffe("test", "--model=missing.prototxt", "--weights=w.caffemodel",
                         cwd=tmp_path, env=clean_env(TMPDIR=tmp))
    assert rc == 1 and "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("caffe: missing.prototxt")
    assert "E" not in letters(err)                             # stderr: the one error line
    for severity in ("INFO", "WARNING", "ERROR"):              # E goes to every lower file
        link = tmp / f"caffe.{severity}"
        assert file_name_re("caffe", severity, pid).match(os.readlink(link))
        body = split_file(link)[1]
        assert body.splitlines()[-1].startswith("E") and last[len("caffe: "):] in body
    assert not (tmp / "caffe.FATAL").exists()
    assert "I" in letters(split_file(tmp / "caffe.INFO")[1])   # "Use CPU."


def test_command_line_glog_flags(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (tmp_path / "deploy.prototxt").write_text(DEPLOY)
    rc, err, pid = caffe("time", "--model=deploy.prototxt", "--iterations=1", f"--log_dir={logs}",
                         cwd=tmp_path, env=clean_env(GLOG_logtostderr=1))
    assert rc == 0, err[-2000:]
    # --log_dir does not undo GLOG_logtostderr=1; --nologtostderr does.
    assert list(logs.iterdir()) == []
    rc, err, pid = caffe("time", "--model=deploy.prototxt", "--iterations=1", f"--log_dir={logs}",
                         "--nologtostderr", "-minloglevel", "0", cwd=tmp_path,
                         env=clean_env(GLOG_logtostderr=1, GLOG_minloglevel=2))
    assert rc == 0, err[-2000:]
    assert file_name_re("caffe", "INFO", pid).match(os.readlink(logs / "caffe.INFO"))
    assert split_file(logs / "caffe.INFO")[1] == err
    # --alsologtostderr=false: stderr keeps ERROR and above only (stderrthreshold 2).
    rc, err2, _ = caffe("time", "--model=deploy.prototxt", "--iterations=1", f"--log_dir={logs}",
                        "--alsologtostderr=false", cwd=tmp_path, env=clean_env())
    assert rc == 0 and err2 == ""
    rc, err, _ = caffe("time", "--model=deploy.prototxt", "--minloglevel=x", cwd=tmp_path,
                       env=clean_env())
    assert rc == 1 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == "caffe: illegal value 'x' specified for int32 flag 'minloglevel'"


def test_an_unusable_log_dir_is_one_line_and_the_run_goes_on(tmp_path):
    (tmp_path / "deploy.prototxt").write_text(DEPLOY)
    missing = tmp_path / "no" / "such"
    rc, err, _ = caffe("time", "--model=deploy.prototxt", "--iterations=1", cwd=tmp_path,
                       env=clean_env(GLOG_log_dir=missing))
    assert rc == 0 and "Traceback" not in err and "Average Forward pass" in err
    complaints = [line for line in err.splitlines() if "Could not create logging file" in line]
    assert len(complaints) == 1 and str(missing) in complaints[0]


# ------------------------------------------------------------------------------------------------
# in-process: severities, thresholds, parsing as glog
# ------------------------------------------------------------------------------------------------
def _close_glog_handlers():
    for handler in logger.handlers:
        handler.close()


def test_each_severity_file_gets_its_severity_and_above(tmp_path):
    stream = io.StringIO()
    init_glog("prog", stream=stream, environ={"GLOG_log_dir": str(tmp_path)})
    try:
        logger.info("an info")
        logger.warning("a warning")
        logger.error("an error")
    finally:
        _close_glog_handlers()
    assert letters(stream.getvalue()) == {"E"}     # alsologtostderr off, threshold ERROR ...
    bodies = {s: split_file(tmp_path / f"prog.{s}")[1] for s in ("INFO", "WARNING", "ERROR")}
    assert [letters(b) for b in bodies.values()] == [{"I", "W", "E"}, {"W", "E"}, {"E"}]
    assert bodies["INFO"].splitlines()[1].endswith("] a warning")
    assert not (tmp_path / "prog.FATAL").exists()
    for s in ("INFO", "WARNING", "ERROR"):
        assert re.match(r"prog\..*\.log\.%s\.\d{8}-\d{6}\.%d$" % (s, os.getpid()),
                        os.readlink(tmp_path / f"prog.{s}"))


def test_stderr_threshold_and_minloglevel(tmp_path):
    stream = io.StringIO()
    init_glog("prog", stream=stream, environ={"GLOG_log_dir": str(tmp_path),
                                              "GLOG_stderrthreshold": "1"})
    try:
        logger.info("an info")
        logger.warning("a warning")
    finally:
        _close_glog_handlers()
    assert letters(stream.getvalue()) == {"W"}     # ... here WARNING: glog 0.7 reads it
    stream = io.StringIO()
    init_glog("prog2", alsologtostderr=True, stream=stream,
              environ={"GLOG_log_dir": str(tmp_path), "GLOG_minloglevel": "2"})
    try:
        logger.info("an info")
        logger.warning("a warning")
        logger.error("an error")
    finally:
        _close_glog_handlers()
    assert letters(stream.getvalue()) == {"E"}
    assert letters(split_file(tmp_path / "prog2.INFO")[1]) == {"E"}


def test_environment_parsing_as_glog():
    assert env_bool(None, True) and not env_bool(None, False)
    assert all(env_bool(v, False) for v in ("1", "true", "True", "yes", "Y", "t", ""))
    assert not any(env_bool(v, True) for v in ("0", "false", "no", "2", "on"))
    assert [env_int(v, 7) for v in (None, "3", " -2", "+4x", "x", "")] == [7, 3, -2, 4, 0, 0]
    f = GlogFlags.from_env({})
    assert (f.logtostderr, f.alsologtostderr, f.stderrthreshold, f.minloglevel, f.log_dir, f.v) \
        == (False, False, 2, 0, "", 0)
    f = GlogFlags.from_env({"GOOGLE_LOG_DIR": "/a", "TEST_TMPDIR": "/b", "GOOGLE_LOGTOSTDERR": "1",
                            "GLOG_v": "2"})
    assert (f.log_dir, f.logtostderr, f.v) == ("/a", True, 2)
    assert GlogFlags.from_env({"GOOGLE_LOG_DIR": "/a", "GLOG_log_dir": "/c"}).log_dir == "/c"
    assert GlogFlags.from_env({"GLOG_logtostderr": "0", "GOOGLE_LOGTOSTDERR": "1"}).logtostderr \
        is False


def test_logging_directories_and_names(tmp_path):
    assert glog.logging_directories(GlogFlags(log_dir="/x")) == ["/x"]
    env = {"TMPDIR": str(tmp_path / "missing"), "TMP": str(tmp_path)}
    assert glog.logging_directories(GlogFlags(), env) == [str(tmp_path / "missing"), str(tmp_path),
                                                          "./"]
    assert glog.logging_directories(GlogFlags(), {}) == ["/tmp", "./"]
    assert glog.program_name("/usr/bin/caffe") == "caffe"
    assert glog.program_name("tools/convert_imageset.py") == "convert_imageset"
    assert glog.user_name({"USER": "ann"}) == "ann" and glog.user_name({"USER": ""}) == "invalid-user"
    assert glog.min_level(0) == logging.INFO and glog.min_level(1) == logging.WARNING
    assert glog.min_level(4) > logging.CRITICAL


def test_vlog_follows_glog_v(tmp_path):
    stream = io.StringIO()
    init_glog("prog", alsologtostderr=True, stream=stream, environ={"GLOG_logtostderr": "1",
                                                                    "GLOG_v": "1"})
    glog.vlog(1, "shown %d", 1)
    glog.vlog(2, "hidden")
    assert glog.vlog_is_on(1) and not glog.vlog_is_on(2)
    assert re.search(r"test_glog_env\.py:\d+\] shown 1\n$", stream.getvalue())
    assert "hidden" not in stream.getvalue()


@pytest.fixture(autouse=True)
def _reset_flags():
    saved = glog.FLAGS
    yield
    glog.FLAGS = saved
