"""The memory gate of `gpuscope check`: rounds of load against a service, judged against a baseline.

    verdict   what a round measured, the baseline file, and the verdict over the rounds
    run       driving the service through the rounds and measuring each one
    report    the summary, the `gpuscope.check/1` JSON and JUnit XML

It may use every other part of the core.
"""
