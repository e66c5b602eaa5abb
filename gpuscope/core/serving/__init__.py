"""The service's signals: latency, TTFT/TPOT, tokens/s, queue and per-stage latency.

    model        the immutable values the serving sources hand to whatever renders them
    fetch        one HTTP GET, bounded in bytes, time and redirects (also the fleet's and the gate's)
    exposition   parsing a /metrics body (Prometheus text or OpenMetrics)
    promql       Prometheus's own arithmetic (rate, histogram_quantile) for gpuscope's own scrapes
    profiles     which metrics mean what, per serving stack, and the queries for them
    scrape       the scrape source: /metrics read by gpuscope
    prometheus   the Prometheus source: the same signals asked of a Prometheus server
    changepoint  when latency jumped: a one-sided CUSUM on the P99
    source       the serving source the console and the headless commands use

It may use `common` and `settings`; it knows nothing of processes or of the diagnosis.
"""
