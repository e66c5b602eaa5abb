"""The two kinds of error the command line reports as one plain line (never a traceback)."""


class UsageError(Exception):
    """Bad input: printed as one plain line, exit status 2."""


class Failure(Exception):
    """Something the user must fix (no such process, no terminal): one plain line, exit status 1."""
