"""One running process, seen from outside and reached inside, never with gpuscope's rights.

    interpreter   what the process is before it is touched: Python or not, which version, whose
    privilege     the owner's rights for anything run on the process's behalf
    stacks        Python stacks as gpuscope keeps them: threads, frames, suspects
    pyspy         stack dumps through py-spy
    probe_client  finding and talking to gpuscope's probe inside a service
    inject        bringing the probe into a running Python process

It may use `common` only.
"""
