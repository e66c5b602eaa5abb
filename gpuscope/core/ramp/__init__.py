"""The load ramp of `gpuscope ramp`: rising load until the P99 breaks, with memory per request at every step.

    rule     when the ramp stops: the P99 break rule (a CUSUM increment against a rolling baseline) and its watch
    load     the load: requests sent at a paced rate (HTTP, OpenAI chat), or the user's load command
    drive    the steps and their measuring intervals, the limits, the interrupt
    result   what was measured, the critical throughput with its uncertainty, memory per request
    report   the summary, the `gpuscope.ramp/1` JSON, Markdown with a chart, JUnit XML

It may use every other part of the core (it drives the service the way `gate` does).
"""
