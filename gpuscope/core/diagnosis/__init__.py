"""The seven-step diagnosis: from a memory-growth alert to the process and the code path.

    steps          the seven steps over collected evidence, and the verdict
    evidence       what a verdict rests on, measured once, and the lines that say it
    attribution    what the search for allocation sites found, and how stacks become suspects
    ladder         the search for allocation sites: one rung after another (`attribute`)
    recorded       the evidence in what a source recorded (the live node's histories, a recording)
    investigation  collecting the evidence: watching one process, its GPU and the service

It may read the node's values (`node`), the service's signals (`serving`), the process
(`target`), the leak detector (`leak`) and `common`.
"""
