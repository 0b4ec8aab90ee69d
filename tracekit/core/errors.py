"""Errors the user can fix: the CLI prints each as one line on stderr and exits 2."""


class TracekitError(Exception):
    """Input or options that tracekit cannot use."""


class TraceError(TracekitError):
    """Bad input: `path` names the file or directory, `reason` says what is wrong (one line)."""

    def __init__(self, path, reason: str):
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")

    def __reduce__(self):  # raised in a worker process, re-raised here
        return type(self), (self.path, self.reason)


class UsageError(TracekitError):
    """An option that cannot work here (a bad pattern, a missing optional extra)."""
