"""Starts gpuscope's probe in every Python process started under `gpuscope run`.

`gpuscope run` puts this folder first on PYTHONPATH, so Python's `site` imports this module at
start-up, before the program's main module runs. It starts the probe, then runs the
`sitecustomize` this one shadows (the next one on sys.path), if there is one. It must never stop
the program: any failure is one line on stderr. Standard library only, and Python 3.8-compatible
(the program's interpreter may be older than gpuscope's).
"""


def _gpuscope_start_probe():
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    mine = os.path.join(os.path.dirname(here), "probe.py")
    try:
        probe = None
        try:
            from gpuscope import probe as installed  # the program's own gpuscope, if it is this one

            if os.path.realpath(installed.__file__) == os.path.realpath(mine):
                probe = installed
        except Exception:
            pass
        if probe is None:
            probe = sys.modules.get("gpuscope_probe")
        if probe is None:
            import importlib.util

            spec = importlib.util.spec_from_file_location("gpuscope_probe", mine)
            probe = importlib.util.module_from_spec(spec)
            sys.modules["gpuscope_probe"] = probe
            spec.loader.exec_module(probe)
        probe.start()
    except Exception as exc:
        try:
            sys.stderr.write("gpuscope run: the probe did not start (%s: %s)\n" % (type(exc).__name__, exc))
        except Exception:
            pass
    return here


def _gpuscope_chain(here):
    """Run the sitecustomize this module hides, as `site` would have."""
    import importlib.machinery
    import importlib.util
    import os
    import sys

    try:
        path = [p for p in sys.path if os.path.abspath(p or ".") != here]
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
        if spec is None or spec.loader is None:
            return
        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)
    except Exception as exc:
        try:
            sys.stderr.write("Error in sitecustomize; set PYTHONVERBOSE for traceback:\n%s: %s\n" % (type(exc).__name__, exc))
        except Exception:
            pass


_gpuscope_chain(_gpuscope_start_probe())
