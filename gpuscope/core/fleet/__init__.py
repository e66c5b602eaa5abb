"""Beyond one node: the exporter, its Prometheus rules, and the fleet read back from Prometheus.

    exporter   this node's processes as Prometheus metrics (`gpuscope exporter`)
    serving    the exporter's HTTP(S) server, with its reads, lifetimes and connections bounded
    rules      the leak test as Prometheus recording and alerting rules
    collector  the fleet as the exporters report it, and a diagnosis from Prometheus's series
    attach     the command that opens gpuscope on a process of another node

It may use the diagnosis, the node, the serving sources, `leak`, `settings` and `common`.
"""
