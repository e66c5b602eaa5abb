"""gpuscope's core: what it measures and concludes, with no UI, settings file or command line.

Packages by concern, lowest first (a package uses only those below it; `lint-imports` holds it):

    common     the shared helpers: safe text, units, atomic files, the poller
    leak       leak or not over one memory series: the floor sketch, the analysis, the live watch
    target     one running process: what it is, whose rights, its stacks, its probe
    settings   the settings the parts take, as plain immutable values
    node       this node's GPUs and processes, sampled on a tick
    serving    the service's signals from /metrics or Prometheus
    diagnosis  the seven steps from an alert to the process and the code path
    fleet      the exporter, its rules, the fleet read back from Prometheus
    session    recording what the console saw, reading it back, the report
    gate       the memory gate of `gpuscope check`
    ramp       the load ramp of `gpuscope ramp`: rising load to the P99 knee (it drives the service as the gate does)
"""
