"""The sweeps' child runner (validate/pytorch_tests.run_watched, shared with transformers_tests):
each test recorded, a child that dies is recorded as a crash and a fresh child goes on."""
import os
import sys

from torchtpu.validate.pytorch_tests import _plugin_dir, _read_log, run_watched


def test_run_watched_records_passes_failures_and_a_crash(tmp_path):
    (tmp_path / "test_x.py").write_text(
        "import os\n"
        "def test_a(): pass\n"
        "def test_b(): assert False\n"
        "def test_c(): os._exit(3)\n"   # the child dies here
        "def test_d(): pass\n")
    log, done = tmp_path / "log.jsonl", tmp_path / "done.txt"
    env = dict(os.environ, PTSWEEP_LOG=str(log), PTSWEEP_DONE=str(done), PTSWEEP_TIMEOUT="60",
               PYTHONPATH=os.pathsep.join([str(_plugin_dir(tmp_path)), os.environ.get("PYTHONPATH", "")]),
               TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "torchtpu_pt_plugin",
           "-o", "addopts=", "--rootdir", str(tmp_path), "test_x.py"]
    _, restarts, n = run_watched(cmd, tmp_path, env, log, done, tmp_path / "out.txt", stall=600,
                                 max_restarts=3)
    results = _read_log(log)[0]
    outcomes = {k.split("::")[-1]: v["outcome"] for k, v in results.items()}
    assert outcomes == {"test_a": "passed", "test_b": "failed", "test_c": "crash", "test_d": "passed"}
    assert n == 4 and restarts == 1
