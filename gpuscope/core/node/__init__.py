"""This node: its GPUs (NVML), its processes and memory (/proc), sampled on a steady tick.

    model           the immutable values a frame carries to whatever renders it
    nvml            GPUs and per-process GPU memory from NVML
    host            processes and host memory from /proc
    torch_memory    PyTorch's allocator, read through the probe of each process that has one
    store           a bounded ring of samples per series
    cgroup          where a process runs: its systemd unit or container, from /proc/PID/cgroup
    command_display how a command line reads in a narrow column
    live            the live source: the tick, the frames, the histories, the leak watch

It may use `common`, `leak` (the watch over every series) and `target` (is a process Python,
its probe); it never imports the diagnosis, the service's signals, the fleet, the gate or sessions.
"""
