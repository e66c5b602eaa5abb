"""The NVML collector against the fake `pynvml` (real function names and error classes)."""

import importlib.util
import json
import subprocess
import sys

import pytest

from gpuscope.core.node.live import NodeSource
from gpuscope.core.node.nvml import NvmlCollector

from helpers import IDLER, fake_nvml_env, gpuscope_cmd

GIB = 1 << 30


def device(**kw):
    base = {"name": "NVIDIA H200", "total": 141 * GIB, "used": 10 * GIB, "util": 37, "temp": 51, "compute": [], "graphics": []}
    base.update(kw)
    return base


def test_no_driver_is_one_status_line_and_nvml_is_initialised_once(fake_nvml):
    fake_nvml.configure({"init_error": "LibraryNotFound"})
    nvml = NvmlCollector()
    first, second = nvml.read(), nvml.read()
    assert first.devices == () and "no NVIDIA driver" in first.status
    assert second.status == first.status
    assert fake_nvml.CALLS.count(fake_nvml.LOAD) == 1  # a missing driver is not looked for again


@pytest.mark.parametrize(
    "error, words", [("DriverNotLoaded", "driver is not loaded"), ("NoPermission", "no permission"), ("Unknown", "Unknown")]
)
def test_other_init_failures_say_why(fake_nvml, error, words):
    fake_nvml.configure({"init_error": error})
    assert words in NvmlCollector().read().status


def test_devices_and_processes_with_not_available_memory(fake_nvml):
    fake_nvml.configure({"devices": [
        device(compute=[{"pid": 10, "used": 3 * GIB}, {"pid": 11, "used": None}], graphics=[{"pid": 10, "used": 1 * GIB}]),
        device(name="NVIDIA H200 NVL", compute=[{"pid": 12, "used": 5 * GIB}]),
    ]})
    reading = NvmlCollector().read()
    assert reading.status is None and reading.driver == "550.54.15"
    assert [d.name for d in reading.devices] == ["NVIDIA H200", "NVIDIA H200 NVL"]
    d0 = reading.devices[0]
    assert (d0.memory_used, d0.memory_total, d0.utilization, d0.temperature) == (10 * GIB, 141 * GIB, 37, 51)
    uses = {(u.pid, u.device): u for u in reading.uses}
    assert uses[(10, 0)].kind == "C+G" and uses[(10, 0)].memory == 3 * GIB
    assert uses[(11, 0)].memory is None  # N/A, not 0
    assert uses[(12, 1)].memory == 5 * GIB


def test_older_driver_falls_back_to_the_previous_process_query_and_remembers(fake_nvml):
    fake_nvml.configure({"devices": [device(
        missing=["nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v3"],
        compute=[{"pid": 10, "used": GIB}],
    )]})
    nvml = NvmlCollector()
    assert [u.pid for u in nvml.read().uses] == [10]
    fake_nvml.CALLS.clear()
    nvml.read()
    assert "nvmlDeviceGetComputeRunningProcesses_v2" in fake_nvml.CALLS
    assert "nvmlDeviceGetComputeRunningProcesses_v3" not in fake_nvml.CALLS


def test_what_never_changes_is_asked_once_and_a_lost_gpu_is_looked_up_afresh(fake_nvml):
    """A GPU's name and UUID are read with its handle, the number of GPUs every COUNT_KEPT_S: each
    read asks only what moves (memory, utilisation, temperature, processes)."""
    fake_nvml.configure({"devices": [device(), device(name="NVIDIA H100")]})
    nvml = NvmlCollector()
    first = nvml.read()
    fake_nvml.CALLS.clear()
    second = nvml.read()
    assert [d.name for d in second.devices] == [d.name for d in first.devices] == ["NVIDIA H200", "NVIDIA H100"]
    assert second.devices[0].uuid == first.devices[0].uuid is not None
    asked = set(fake_nvml.CALLS)
    assert not asked & {"nvmlDeviceGetCount", "nvmlDeviceGetCount_v2", "nvmlDeviceGetName", "nvmlDeviceGetUUID"}, asked
    assert fake_nvml.CALLS.count("nvmlDeviceGetMemoryInfo") + fake_nvml.CALLS.count("nvmlDeviceGetMemoryInfo_v2") == 2
    # lost, then back after a reset as another GPU: looked up afresh, the count asked again
    fake_nvml.configure({"devices": [device(errors={"nvmlDeviceGetMemoryInfo": "GpuIsLost"}), device(name="NVIDIA H100")]})
    assert "GPU is lost" in nvml.read().devices[0].error
    fake_nvml.configure({"devices": [device(name="NVIDIA B200"), device(name="NVIDIA H100")]})
    fake_nvml.CALLS.clear()
    assert [d.name for d in nvml.read().devices] == ["NVIDIA B200", "NVIDIA H100"]
    assert {"nvmlDeviceGetName", "nvmlDeviceGetUUID"} <= set(fake_nvml.CALLS)


def test_a_lost_gpu_is_an_error_on_that_device_only(fake_nvml):
    fake_nvml.configure({"devices": [
        device(errors={"nvmlDeviceGetMemoryInfo": "GpuIsLost"}, compute=[{"pid": 10, "used": GIB}]),
        device(compute=[{"pid": 12, "used": GIB}]),
    ]})
    reading = NvmlCollector().read()
    assert "GPU is lost" in reading.devices[0].error and reading.devices[0].memory_used is None
    assert reading.devices[1].error is None
    assert [u.pid for u in reading.uses] == [12]


def test_no_permission_and_unsupported_fields(fake_nvml):
    fake_nvml.configure({"devices": [
        device(errors={"nvmlDeviceGetMemoryInfo": "NoPermission"}),
        device(errors={
            "nvmlDeviceGetTemperature": "NotSupported",
            "nvmlDeviceGetUtilizationRates": "NoPermission",
            "nvmlDeviceGetComputeRunningProcesses_v3": "NoPermission",
        }),
    ]})
    reading = NvmlCollector().read()
    assert reading.devices[0].error == "no permission to read this GPU's memory"
    d1 = reading.devices[1]
    assert d1.error is None and d1.temperature is None and d1.utilization is None and d1.memory_used == 10 * GIB
    assert reading.uses == ()
    # The refused process list is said, not read as "no processes": one notice for that GPU.
    assert reading.notices == ("GPU 1: NVML refused to list its processes (no permission); their GPU memory is not shown",)


@pytest.mark.parametrize("error, why", [("NoPermission", "no permission"), ("NotSupported", "not supported")])
def test_a_refused_process_list_is_one_notice_per_gpu_that_ps_shows(tmp_path, error, why):
    """Both process queries refused on GPU 0 (and every version of each): one line for GPU 0, in
    the frame's notices, which `gpuscope ps` prints before its table; GPU 1 lists its processes."""
    refused = {f"nvmlDeviceGet{kind}RunningProcesses{v}": error
               for kind in ("Compute", "Graphics") for v in ("_v3", "_v2", "")}
    scenario = tmp_path / "nvml.json"
    scenario.write_text(json.dumps({"devices": [device(errors=refused), device()]}))
    out = subprocess.run(gpuscope_cmd() + ["ps"], env=fake_nvml_env(scenario), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    notices = [line for line in out.stderr.splitlines() if "refused to list" in line]
    assert notices == [f"# GPU 0: NVML refused to list its processes ({why}); their GPU memory is not shown"], out.stderr


def test_a_process_that_vanishes_between_the_nvml_and_psutil_reads(fake_nvml, spawn_python, monkeypatch):
    alive = spawn_python(IDLER)
    gone = spawn_python(IDLER)
    gone.kill()
    gone.wait()
    fake_nvml.configure({"devices": [device(compute=[{"pid": alive.pid, "used": 2 * GIB}, {"pid": gone.pid, "used": GIB}])]})
    monkeypatch.setattr("gpuscope.core.node.live.in_container", lambda: False)
    frame = NodeSource().sample_once()
    gpu_rows = [r for r in frame.processes if r.gpu is not None]
    assert [(r.pid, r.gpu, r.gpu_memory_bytes) for r in gpu_rows] == [(alive.pid, 0, 2 * GIB)]
    assert gpu_rows[0].rss_bytes > 0 and "python" in gpu_rows[0].command
    assert frame.notices == ()  # on the host, a missing PID has just exited: no banner


def test_pids_invisible_in_a_container_give_one_banner(fake_nvml, monkeypatch):
    fake_nvml.configure({"devices": [device(compute=[{"pid": 4_000_001, "used": GIB}, {"pid": 4_000_002, "used": GIB}])]})
    monkeypatch.setattr("gpuscope.core.node.live.in_container", lambda: True)
    frame = NodeSource().sample_once()
    assert not [r for r in frame.processes if r.gpu is not None]
    assert len(frame.notices) == 1
    assert "2 GPU process(es) using 2.0G" in frame.notices[0] and "--pid=host" in frame.notices[0]


def test_ps_json_end_to_end_with_gpu_processes(tmp_path, spawn_python):
    child = spawn_python(IDLER)
    scenario = tmp_path / "nvml.json"
    scenario.write_text(json.dumps({"devices": [device(compute=[{"pid": child.pid, "used": None}])]}))
    out = subprocess.run(gpuscope_cmd() + ["ps", "--json"], env=fake_nvml_env(scenario), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert rows[0] == {
        "pid": child.pid, "user": rows[0]["user"], "gpu": 0, "gpu_memory_bytes": None,
        "rss_bytes": rows[0]["rss_bytes"], "cpu_percent": rows[0]["cpu_percent"], "command": rows[0]["command"],
        "runs_in": rows[0]["runs_in"],
    }
    assert rows[0]["rss_bytes"] > 0 and str(child.args[1]) in rows[0]["command"]
    assert all(set(r) == {"pid", "user", "gpu", "gpu_memory_bytes", "rss_bytes", "cpu_percent", "command", "runs_in"} for r in rows)


def test_a_hung_nvml_never_stops_host_frames_or_piles_up_threads(fake_nvml, monkeypatch):
    import threading

    from helpers import wait_until

    fake_nvml.configure({"devices": [device()]})
    release = threading.Event()
    real_memory_info = fake_nvml.nvmlDeviceGetMemoryInfo

    def hung(handle, version=None):
        release.wait(30)  # a wedged GPU: the call does not return
        return real_memory_info(handle)

    monkeypatch.setattr(fake_nvml, "nvmlDeviceGetMemoryInfo", hung)
    frames = []
    source = NodeSource(interval=0.05, read_timeout=0.3)
    before = threading.active_count()
    source.start(frames.append)
    try:
        stale = wait_until(lambda: [f for f in frames if any("GPU data is stale" in n for n in f.notices)],
                           timeout=30, what="a notice that NVML is not answering")
        count = len(frames)
        wait_until(lambda: len(frames) > count + 5, timeout=30, what="host frames to keep coming")
        assert "nvml has not answered" in next(n for n in stale[0].notices if "stale" in n)
        # However many ticks: one NVML reader, never a pile of them (the torch reader's own pool,
        # bounded by the probes it finds, is not what this guards).
        nvml_threads = [t for t in threading.enumerate() if t.name == "gpuscope-nvml"]
        assert len(nvml_threads) == 1, [t.name for t in threading.enumerate()]
        assert len([t for t in threading.enumerate() if not t.name.startswith("gpuscope-torch")]) <= before + 4
        assert fake_nvml.CALLS.count("nvmlDeviceGetName") == 1  # one read in flight, no second one
    finally:
        release.set()
        source.stop()


# Other consumers of the real binding: the fake must be the binding, not an imitation of the calls
# gpuscope happens to make. Each runs as its own command, on the fake, unchanged.

def _consumer(module):
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (it is in the test extra)")


def _two_gpu_scenario(tmp_path, pid):
    scenario = tmp_path / "nvml.json"
    scenario.write_text(json.dumps({"driver": "550.54.15", "devices": [
        device(uuid="GPU-aaaa", used=None, temp=57, util=88, compute=[{"pid": pid, "used": 3 * GIB}]),
        device(name="NVIDIA H200 NVL", uuid="GPU-bbbb", util=5),
    ]}))
    return scenario


def test_nvitop_runs_unchanged_on_the_fake(tmp_path, spawn_python):
    _consumer("nvitop")
    child = spawn_python(IDLER)
    env = fake_nvml_env(_two_gpu_scenario(tmp_path, child.pid))
    env["COLUMNS"] = "120"
    out = subprocess.run([sys.executable, "-m", "nvitop", "-1"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "ERROR" not in out.stdout + out.stderr  # nvitop reports a binding it cannot use as ERROR
    assert "550.54.15" in out.stdout and "3072MiB / 141.0GiB" in out.stdout
    assert "57C" in out.stdout and "88%" in out.stdout
    assert any(str(child.pid) in line and "3072MiB" in line for line in out.stdout.splitlines())


def test_gpustat_runs_unchanged_on_the_fake(tmp_path, spawn_python):
    _consumer("gpustat")
    child = spawn_python(IDLER)
    env = fake_nvml_env(_two_gpu_scenario(tmp_path, child.pid))
    out = subprocess.run([sys.executable, "-m", "gpustat", "--json"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    gpus = json.loads(out.stdout)["gpus"]
    assert [(g["index"], g["uuid"], g["name"]) for g in gpus] == [(0, "GPU-aaaa", "NVIDIA H200"), (1, "GPU-bbbb", "NVIDIA H200 NVL")]
    assert (gpus[0]["memory.used"], gpus[0]["memory.total"], gpus[0]["temperature.gpu"], gpus[0]["utilization.gpu"]) == (3072, 141 * 1024, 57, 88)
    assert [(p["pid"], p["gpu_memory_usage"]) for p in gpus[0]["processes"]] == [(child.pid, 3072)]
    assert gpus[1]["processes"] == [] and gpus[1]["memory.used"] == 10 * 1024


def test_gpus_show_as_soon_as_nvml_first_answers_not_a_tick_later(fake_nvml, spawn_python, monkeypatch):
    import threading
    import time

    from helpers import wait_until

    child = spawn_python("import time; print('ready', flush=True); time.sleep(60)")
    fake_nvml.configure({"devices": [device(compute=[{"pid": child.pid, "used": GIB}])]})
    answer = threading.Event()
    real_init = fake_nvml.nvmlInit

    def slow_init(*args, **kwargs):  # a driver that takes a moment to load: the host is read first
        answer.wait(30)
        return real_init(*args, **kwargs)

    monkeypatch.setattr(fake_nvml, "nvmlInit", slow_init)
    frames = []
    source = NodeSource(interval=30.0)  # the next tick is far: only NVML's first answer can bring the GPUs
    source.start(frames.append)
    try:
        wait_until(lambda: frames, timeout=30, what="the first (host) frame")
        assert frames[0].nvml.status == "reading NVML..."
        answered = time.monotonic()
        answer.set()
        wait_until(lambda: any(r.pid == child.pid and r.gpu == 0 for f in frames for r in f.processes),
                   timeout=10, what="the GPU process after NVML's first answer")
        assert time.monotonic() - answered < 5
    finally:
        answer.set()
        source.stop()
